# Session 13, call 5: GPU 1 the d64 training call with the d=64 tiles of next/d64-tiles (flamia, FA4, FA2 alone);
# GPU 0 the d=128 forward on 64-key tiles capped at 168 registers (three programs per SM).
set -u
date -u; nvidia-smi -L
export PYTHONUNBUFFERED=1
mkdir -p /tmp/o /tmp/bundles && cp peer-bundles/fa4_cutlass_cu13_py312.tar.xz /tmp/bundles/
B=/tmp/bundles/fa4_cutlass_cu13_py312.tar.xz
(export CUDA_VISIBLE_DEVICES=1
 BENCH_OUT=/tmp/o/parts timeout 300 benchmarks/run_h200.sh $B --providers flamia:mxfp8,fa4,fa2 --workloads d64 --modes train,fwd,bwd --alone > /tmp/o/d64_set.log 2>&1) &
export CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$PWD
timeout 300 python3 scratch/calls/tune_cfgs.py eq8x8k,logu29-64k,skew8k+224x256 5 '[{"fwd_block_n": 64, "fwd_stages": 4, "fwd_maxnreg": 168}, {"fwd_block_n": 64, "fwd_stages": 3, "fwd_maxnreg": 168}, {"fwd_block_n": 64, "fwd_stages": 4}]' > /tmp/o/fwd128.log 2>&1
grep -v "^json" /tmp/o/fwd128.log | grep -v "Warn\|warn"
wait
grep -A9 "## Training call" /tmp/o/parts/fa4/results.md | tail -7
grep -A9 "## Forward" /tmp/o/parts/fa4/results.md | tail -7
grep -A9 "## Backward" /tmp/o/parts/fa4/results.md | tail -7
tar czf $OUT/s13e.tgz -C /tmp o
