# Session 11, call 9: every gpu test at 252c3f7 (the session's last kernel change).
set -u
date -u; nvidia-smi -L
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p /tmp/o
timeout 280 python3 -m pytest -q -m gpu tests/ --ignore=tests/test_peer_attention.py > /tmp/o/gpu_tests_all.log 2>&1; tail -1 /tmp/o/gpu_tests_all.log
grep -E "FAILED|Error" /tmp/o/gpu_tests_all.log | head -5
tar czf $OUT/s11i.tgz -C /tmp o
