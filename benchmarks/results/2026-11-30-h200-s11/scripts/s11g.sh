# Session 11, call 7: where the graphed training call's time goes beyond its kernels (scratch/calls/gaps.py), with
# the SM clock and power sampled every 50 ms.
set -u
date -u; nvidia-smi -L
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p /tmp/o
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw --format=csv,noheader -lms 50 > /tmp/o/clocks.csv &
SMI=$!
for w in eq8x8k logu11-16k; do timeout 150 python3 scratch/calls/gaps.py $w >> /tmp/o/gaps.jsonl 2>> /tmp/o/gaps.err; done
kill $SMI
cut -c1-1500 /tmp/o/gaps.jsonl; tail -2 /tmp/o/gaps.err
python3 - <<'PY'
rows = [l.split(",") for l in open("/tmp/o/clocks.csv") if l.count(",") == 2]
mhz = [int(r[1].split()[0]) for r in rows]; w = [float(r[2].split()[0]) for r in rows]
print("clock MHz min", min(mhz), "max", max(mhz), "samples", len(mhz), "power W max", max(w))
print("clock histogram", {c: mhz.count(c) for c in sorted(set(mhz))})
PY
tar czf $OUT/s11g.tgz -C /tmp o
