# Session 13, call 8: d=64 accuracy (4 x 4096, 16 heads, causal) with d=64's tiles and with the d=128 tiles.
set -u
date -u; nvidia-smi -L
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p /tmp/o
timeout 200 python3 scratch/calls/acc64.py > /tmp/o/acc64.log 2>&1
grep -v "Warn\|warn" /tmp/o/acc64.log | tail -5
tar czf $OUT/s13h.tgz -C /tmp o
