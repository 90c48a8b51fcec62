# Session 12, call 6: the training call at 42152ff (the dQ masks S before its fused factor). GPU 1: FA4 set (flamia,
# FA4, FA2, each provider alone). GPU 0: kernel_check speed and profile (kernel-only TF/s, CUDA time per call).
# benchmarks/results and experiments/results moved out of the tree for the call (the FA4 bundle's size).
set -u
date -u; nvidia-smi -L
export PYTHONUNBUFFERED=1
mkdir -p /tmp/o /tmp/bundles && cp peer-bundles/fa4_cutlass_cu13_py312.tar.xz /tmp/bundles/
B=/tmp/bundles/fa4_cutlass_cu13_py312.tar.xz
(export CUDA_VISIBLE_DEVICES=1
 BENCH_OUT=/tmp/o/parts timeout 200 benchmarks/run_h200.sh $B --providers flamia:mxfp8,fa4,fa2 --workloads causal --modes train,fwd,bwd,memory --alone > /tmp/o/fa4_set.log 2>&1) &
export CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$PWD
timeout 150 python3 benchmarks/kernel_check.py --skip tune,sass,graph --out /tmp/o/kc > /tmp/o/kc.log 2>&1
grep -v Warn /tmp/o/kc.log | grep "^correctness\|^|" | cut -c1-300
grep "^profile eq8" /tmp/o/kc.log | cut -c1-400
wait
grep -A9 "## Training call" /tmp/o/parts/fa4/results.md | tail -7
tar czf $OUT/s12f.tgz -C /tmp o
