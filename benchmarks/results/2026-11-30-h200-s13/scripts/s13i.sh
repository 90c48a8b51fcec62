# Session 13, call 9: every gpu test at main's HEAD (d=64's tiles merged).
set -u
date -u; nvidia-smi -L; git log --oneline -1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p /tmp/o
timeout 400 python3 -m pytest -q -m gpu tests/ --ignore=tests/test_peer_attention.py > /tmp/o/gpu_tests_all.log 2>&1
tail -2 /tmp/o/gpu_tests_all.log
tar czf $OUT/s13i.tgz -C /tmp o
