# Session 9, call 10 (final): every gpu test, probe and accuracy on main with the 64-query Gluon dK/dV.
set -u
date -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 185 python3 -m pytest -q -m gpu tests/ --ignore=tests/test_peer_attention.py -p no:cacheprovider > $OUT/gpu_tests_all.log 2>&1; tail -1 $OUT/gpu_tests_all.log
timeout 20 python3 -m flamia probe > $OUT/probe.log 2>&1; tail -1 $OUT/probe.log
timeout 25 python3 -m flamia accuracy > $OUT/accuracy.log 2>&1; tail -2 $OUT/accuracy.log
