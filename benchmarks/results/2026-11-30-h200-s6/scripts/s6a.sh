# Session 6, call 1: verify 3af54b8 on the GPU (GPU 0: GPU tests, kernel_check), host time after
# sharing tile lists/key records, and the FA4 set timed --alone vs interleaved with clocks/power
# logged by nvidia-smi dmon (GPU 1).
set -u
date -u; nvidia-smi -L; git log --oneline -1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p /tmp/o /tmp/bundles && cp peer-bundles/fa4_cutlass_cu13_py312.tar.xz /tmp/bundles/
B=/tmp/bundles/fa4_cutlass_cu13_py312.tar.xz
(export CUDA_VISIBLE_DEVICES=1
 timeout 60 python3 scratch/calls/host_parts.py > /tmp/o/host_parts.txt 2>&1
 timeout 60 python3 scratch/calls/host_time.py > /tmp/o/host_time.txt 2>&1
 for mode in alone interleaved; do
   extra=""; [ $mode = alone ] && extra="--alone"
   nvidia-smi dmon -i 1 -s pc -d 1 > /tmp/o/dmon_$mode.txt 2>&1 & DM=$!
   BENCH_OUT=/tmp/o/$mode timeout 170 benchmarks/run_h200.sh $B --providers flamia:mxfp8,fa4,fa2 --workloads causal --modes train $extra > /tmp/o/$mode.log 2>&1
   kill $DM
 done) &
export CUDA_VISIBLE_DEVICES=0
timeout 150 python3 -m pytest -q -m gpu tests/ --ignore=tests/test_peer_attention.py > /tmp/o/gpu_tests_all.log 2>&1; tail -2 /tmp/o/gpu_tests_all.log
timeout 90 python3 -m pytest -q tests/test_kernel_prefix.py tests/test_records.py tests/test_worklist.py tests/test_kernel_quantize.py tests/test_kernel_ops.py > /tmp/o/new_kernels_gpu.log 2>&1; tail -2 /tmp/o/new_kernels_gpu.log
timeout 150 python3 benchmarks/kernel_check.py --skip tune,sass --out /tmp/o/kc > /tmp/o/kc.log 2>&1
grep -v Warn /tmp/o/kc.log | grep "^correctness\|^graph\|^|" | cut -c1-300
grep "^profile" /tmp/o/kc.log | cut -c1-200
wait
grep -v Warn /tmp/o/host_parts.txt | head -12; grep -v Warn /tmp/o/host_time.txt
for mode in alone interleaved; do echo "== $mode"; grep -A9 "## Training call" /tmp/o/$mode/fa4/results.md | tail -7; done
tar czf $OUT/s6a.tgz -C /tmp o
