# Session 13, call 7: the Gluon dK/dV bitwise tests after the register cap's check stopped refusing the Triton twin.
set -u
date -u; nvidia-smi -L
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p /tmp/o
timeout 300 python3 -m pytest -q -m gpu tests/test_kernel_bwd.py -k gluon_dkdv > /tmp/o/gpu_tests_dkdv.log 2>&1
tail -3 /tmp/o/gpu_tests_dkdv.log
tar czf $OUT/s13g.tgz -C /tmp o
