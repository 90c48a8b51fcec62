# Session 10, call 2: dK/dV reads its query records as copied (no document-end select): bitwise vs the Triton
# kernel (gpu tests of the backward), then interleaved A/B against HEAD's kernel (scratch/calls/old_dkdv_gluon.py).
set -u
date -u; nvidia-smi -L
python3 -c "import torch,triton;print('torch',torch.__version__,'triton',triton.__version__)"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p /tmp/o
timeout 200 python3 -m pytest -q -m gpu tests/test_kernel_bwd.py > /tmp/o/gpu_tests_bwd.log 2>&1; tail -1 /tmp/o/gpu_tests_bwd.log
grep -E "FAILED|Error" /tmp/o/gpu_tests_bwd.log | head -5
timeout 200 python3 scratch/calls/ab3.py '[{"name":"new"},{"name":"old","dkdv":"scratch/calls/old_dkdv_gluon.py"}]' eq4x4k,eq8x8k,skew8k+32x256,skew8k+224x256,logu11-16k,logu29-64k 5 > /tmp/o/ab3.jsonl 2> /tmp/o/ab3.err
cat /tmp/o/ab3.jsonl; tail -2 /tmp/o/ab3.err
tar czf $OUT/s10b.tgz -C /tmp o
