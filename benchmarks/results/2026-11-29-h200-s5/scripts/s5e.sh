# Session 5, call 5 (one GPU): the demo's eager speed, diagnosed.
set -u
date -u; nvidia-smi -L
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p /tmp/o
for m in alone full profile; do echo "== $m"; timeout 150 python3 scratch/calls/speed_diag.py $m 2>&1 | grep -v "^ *\(mxfp8\|nvfp4\|fp4\|bf16\|accuracy\|workload\|recipe\|paper\)" | grep -v Warn | cut -c1-110 | tee /tmp/o/diag_$m.txt; done
tar czf $OUT/s5e.tgz -C /tmp o
