# Session 13, call 6: every gpu test on branch next/d64-tiles after the Gluon bitwise tests moved to the shipped
# tiles of each head dim (d=64: 64-key forward tiles, 4 stages; dQ 2 stages; dK/dV capped at 168 registers).
set -u
date -u; nvidia-smi -L
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p /tmp/o
timeout 400 python3 -m pytest -q -m gpu tests/ --ignore=tests/test_peer_attention.py > /tmp/o/gpu_tests_all.log 2>&1
tail -3 /tmp/o/gpu_tests_all.log
tar czf $OUT/s13f.tgz -C /tmp o
