# Session 13, call 1: the training call at HEAD (45485d8, with ac02483 folded dQ payload). GPU 0: every gpu-marked test, kernel_check, probe, accuracy.
# GPU 1: FA4 and torch sets (training call, each provider alone).
# Size: the tracked tree (~10 MB) plus the FA4 bundle (55 MiB) passes 64 MiB; move benchmarks/results and
# experiments/results out of the working tree for the call (session 9 did), and back after.
set -u
date -u; nvidia-smi -L
python3 -c "import torch,triton;print('torch',torch.__version__,'triton',triton.__version__)"
export PYTHONUNBUFFERED=1
mkdir -p /tmp/o /tmp/bundles && cp peer-bundles/fa4_cutlass_cu13_py312.tar.xz /tmp/bundles/
B=/tmp/bundles/fa4_cutlass_cu13_py312.tar.xz
(export CUDA_VISIBLE_DEVICES=1
 BENCH_OUT=/tmp/o/parts timeout 150 benchmarks/run_h200.sh $B --providers flamia:mxfp8,fa4,fa2 --workloads causal --modes train,fwd,bwd,memory --alone > /tmp/o/fa4_set.log 2>&1
 BENCH_OUT=/tmp/o/parts timeout 90 benchmarks/run_h200.sh torch --providers flamia:mxfp8,fa2,sdpa-nested --workloads causal --modes train,memory --alone > /tmp/o/torch_set.log 2>&1) &
export CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$PWD
timeout 300 python3 -m pytest -q -m gpu tests/ --ignore=tests/test_peer_attention.py > /tmp/o/gpu_tests_all.log 2>&1; tail -1 /tmp/o/gpu_tests_all.log
timeout 90 python3 benchmarks/kernel_check.py --skip tune,sass --out /tmp/o/kc > /tmp/o/kc.log 2>&1
timeout 30 python3 -m flamia probe > /tmp/o/probe.log 2>&1; tail -1 /tmp/o/probe.log
timeout 30 python3 -m flamia accuracy > /tmp/o/accuracy.log 2>&1; tail -2 /tmp/o/accuracy.log
grep -v Warn /tmp/o/kc.log | grep "^correctness\|^|" | cut -c1-300
grep "^profile eq8" /tmp/o/kc.log | cut -c1-400
wait
for t in fa4 torch; do grep -A9 "## Training call" /tmp/o/parts/$t/results.md | tail -7; done
tar czf $OUT/s13a.tgz -C /tmp o
