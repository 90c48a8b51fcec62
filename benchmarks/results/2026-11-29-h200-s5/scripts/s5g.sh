# Session 5, call 7 (one GPU): host time per stage of the eager training call.
set -u
date -u; nvidia-smi -L
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p /tmp/o
timeout 100 python3 scratch/calls/host_parts.py 2>&1 | grep -v Warn | tee /tmp/o/host_parts.txt
tar czf $OUT/s5g.tgz -C /tmp o
