# Session 5, call 8 (last): the host-time work (PV, records and aligned starts in one launch each).
# GPU 0 = GPU tests, the new kernels' tests on the GPU, kernel_check; GPU 1 = host times, eager walls,
# the demo, flamia's graphed training call (torch set, flamia alone).
set -u
date -u; nvidia-smi -L
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p /tmp/o
(export CUDA_VISIBLE_DEVICES=1
 timeout 60 python3 scratch/calls/host_parts.py > /tmp/o/host_parts.txt 2>&1
 timeout 60 python3 scratch/calls/host_time.py > /tmp/o/host_time.txt 2>&1
 timeout 60 python3 -m flamia demo > /tmp/o/demo.log 2>&1
 BENCH_OUT=/tmp/o/parts timeout 150 benchmarks/run_h200.sh torch --providers flamia:mxfp8 --workloads causal --modes train > /tmp/o/torch_set.log 2>&1) &
export CUDA_VISIBLE_DEVICES=0
timeout 150 python3 -m pytest -q -m gpu tests/ --ignore=tests/test_peer_attention.py > /tmp/o/gpu_tests_all.log 2>&1; tail -2 /tmp/o/gpu_tests_all.log
timeout 90 python3 -m pytest -q tests/test_kernel_prefix.py tests/test_records.py tests/test_worklist.py tests/test_kernel_quantize.py > /tmp/o/new_kernels_gpu.log 2>&1; tail -2 /tmp/o/new_kernels_gpu.log
timeout 150 python3 benchmarks/kernel_check.py --skip tune,sass --out /tmp/o/kc > /tmp/o/kc.log 2>&1
grep -v Warn /tmp/o/kc.log | grep "^correctness\|^graph\|^|" | cut -c1-300
grep "^profile" /tmp/o/kc.log | cut -c1-200
wait
grep -v Warn /tmp/o/host_parts.txt | head -12; grep -v Warn /tmp/o/host_time.txt
tail -5 /tmp/o/demo.log
grep -A9 "## Training call" /tmp/o/parts/torch/results.md | tail -7
tar czf $OUT/s5h.tgz -C /tmp o
