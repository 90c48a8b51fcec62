# Session 13, call 2: the variant workloads (non-causal, GQA 16/4, d=64) at HEAD, each provider alone (GPU 1),
# and a one-change-at-a-time sweep of the untuned d=64 tiles (GPU 0).
set -u
date -u; nvidia-smi -L
export PYTHONUNBUFFERED=1
mkdir -p /tmp/o /tmp/bundles && cp peer-bundles/fa4_cutlass_cu13_py312.tar.xz /tmp/bundles/
B=/tmp/bundles/fa4_cutlass_cu13_py312.tar.xz
(export CUDA_VISIBLE_DEVICES=1
 BENCH_OUT=/tmp/o/parts timeout 330 benchmarks/run_h200.sh $B --providers flamia:mxfp8,fa4,fa2 --workloads noncausal,gqa,d64 --modes train --alone > /tmp/o/variants.log 2>&1) &
export CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$PWD
timeout 330 python3 scratch/calls/d64tune.py eq8x8k-d64,logu29-64k-d64,skew8k+224x256-d64 3 > /tmp/o/d64tune.log 2>&1
grep -v "^json" /tmp/o/d64tune.log | grep -v Warn | tail -50
wait
grep -A21 "## Training call" /tmp/o/parts/fa4/results.md | tail -19
tail -3 /tmp/o/variants.log
tar czf $OUT/s13b.tgz -C /tmp o
