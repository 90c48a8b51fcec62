# Session 8, call 6 (final): HEAD (Gluon forward and dQ, key words per scale block). GPU 0: GPU tests, kernel tests on CUDA, kernel_check.
# GPU 1: quantizer mini-sweep (1 warp too), FA4 and torch sets (training call, each provider alone).
set -u
date -u; nvidia-smi -L
python3 -c "import torch,triton;print('torch',torch.__version__,'triton',triton.__version__)"
export PYTHONUNBUFFERED=1
mkdir -p /tmp/o /tmp/bundles && cp peer-bundles/fa4_cutlass_cu13_py312.tar.xz /tmp/bundles/
B=/tmp/bundles/fa4_cutlass_cu13_py312.tar.xz
(export CUDA_VISIBLE_DEVICES=1
 nvidia-smi dmon -i 1 -s pc -d 1 > /tmp/o/dmon.txt 2>&1 & DM=$!
 BENCH_OUT=/tmp/o/parts timeout 240 benchmarks/run_h200.sh $B --providers flamia:mxfp8,fa4,fa2 --workloads causal --modes train,fwd,bwd,memory --alone > /tmp/o/fa4_set.log 2>&1
 BENCH_OUT=/tmp/o/parts timeout 120 benchmarks/run_h200.sh torch --providers flamia:mxfp8,fa2,sdpa-nested --workloads causal --modes train,memory --alone > /tmp/o/torch_set.log 2>&1
 kill $DM) &
export CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$PWD
timeout 60 python3 -m pytest -q tests/test_kernel_prefix.py tests/test_records.py tests/test_worklist.py tests/test_kernel_quantize.py tests/test_kernel_ops.py > /tmp/o/new_kernels_gpu.log 2>&1; tail -2 /tmp/o/new_kernels_gpu.log
timeout 150 python3 benchmarks/kernel_check.py --skip tune,sass --out /tmp/o/kc > /tmp/o/kc.log 2>&1
timeout 60 python3 -m flamia probe > /tmp/o/probe.log 2>&1; tail -1 /tmp/o/probe.log
timeout 60 python3 -m flamia accuracy > /tmp/o/accuracy.log 2>&1; tail -3 /tmp/o/accuracy.log
grep -v Warn /tmp/o/kc.log | grep "^correctness\|^graph\|^|" | cut -c1-420
grep "^profile" /tmp/o/kc.log | cut -c1-250
wait
for t in fa4 torch; do grep -A9 "## Training call" /tmp/o/parts/$t/results.md | tail -7; done
tar czf $OUT/s8f.tgz -C /tmp o
