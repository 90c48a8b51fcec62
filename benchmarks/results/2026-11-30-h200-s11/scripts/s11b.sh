# Session 11, call 2: quantizer variants (scratch/calls/qab.py), bitwise and timed on all six workloads; then the
# quantizer gpu tests with the Gluon kernel serving V too.
set -u
date -u; nvidia-smi -L
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p /tmp/o
timeout 300 python3 scratch/calls/qab.py eq4x4k,eq8x8k,skew8k+32x256,skew8k+224x256,logu11-16k,logu29-64k 3 > /tmp/o/qab.jsonl 2> /tmp/o/qab.err
cat /tmp/o/qab.jsonl; tail -3 /tmp/o/qab.err
timeout 200 python3 -m pytest -q -m gpu tests/test_kernel_quantize.py tests/test_kernel_fwd.py > /tmp/o/gpu_tests.log 2>&1; tail -1 /tmp/o/gpu_tests.log
grep -E "FAILED|Error" /tmp/o/gpu_tests.log | head -5
tar czf $OUT/s11b.tgz -C /tmp o
