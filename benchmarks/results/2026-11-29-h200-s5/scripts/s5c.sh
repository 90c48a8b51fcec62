# Session 5, call 3: main with the work-list grids (5eae5cc), peers in the same call.
# GPU 1 = the FA4 set (flamia, FA4, FA2; train, fwd, bwd, memory), nothing else on that GPU.
# GPU 0 = the probe and the accuracy report on the Triton kernels, the torch set (FA2, SDPA on
# nested tensors), every GPU test but the peers', the demo.
set -u
date -u; nvidia-smi -L
export PYTHONUNBUFFERED=1
mkdir -p /tmp/bundles /tmp/o && cp peer-bundles/fa4_cutlass_cu13_py312.tar.xz /tmp/bundles/
(CUDA_VISIBLE_DEVICES=1 BENCH_OUT=/tmp/o/parts timeout 300 benchmarks/run_h200.sh /tmp/bundles/fa4_cutlass_cu13_py312.tar.xz \
  --providers flamia:mxfp8,fa4,fa2 --workloads causal --modes train,fwd,bwd,memory > /tmp/o/fa4_set.log 2>&1) &
export CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$PWD
timeout 60 python3 -m flamia probe > /tmp/o/probe_triton.txt 2>&1; tail -4 /tmp/o/probe_triton.txt
timeout 60 python3 -m flamia probe --per-tensor > /tmp/o/probe_per_tensor.txt 2>&1; tail -2 /tmp/o/probe_per_tensor.txt
timeout 90 python3 -m flamia accuracy > /tmp/o/accuracy.txt 2>&1; tail -8 /tmp/o/accuracy.txt
BENCH_OUT=/tmp/o/parts timeout 200 benchmarks/run_h200.sh torch --providers flamia:mxfp8,fa2,sdpa-nested \
  --workloads causal --modes train,fwd,bwd,memory > /tmp/o/torch_set.log 2>&1; tail -2 /tmp/o/torch_set.log
timeout 150 python3 -m pytest -q -m gpu tests/ --ignore=tests/test_peer_attention.py > /tmp/o/gpu_tests_all.log 2>&1; tail -2 /tmp/o/gpu_tests_all.log
timeout 60 python3 -m flamia demo > /tmp/o/demo.log 2>&1; tail -6 /tmp/o/demo.log
wait
grep -A9 "## Training call" /tmp/o/parts/fa4/results.md | tail -7
grep -A9 "## Training call" /tmp/o/parts/torch/results.md | tail -7
grep -A9 "## Peak" /tmp/o/parts/fa4/results.md | tail -7
tar czf $OUT/s5c.tgz -C /tmp o
