# Session 5, call 6 (one GPU): the eager training call's host time.
set -u
date -u; nvidia-smi -L
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p /tmp/o
timeout 120 python3 scratch/calls/host_time.py 2>&1 | grep -v Warn | tee /tmp/o/host_time.txt
tar czf $OUT/s5f.tgz -C /tmp o
