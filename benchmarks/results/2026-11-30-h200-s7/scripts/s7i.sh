# Session 7, call 9: stages re-check at HEAD (kernel-only, eq8x8k), after the backward lost instructions and spills.
set -u
date -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p /tmp/o
timeout 100 python3 scratch/calls/ab.py $PWD head '[{},{"bwd_stages":3},{"dq_stages":4},{"dq_stages":2},{"fwd_stages":4},{}]' eq8x8k > /tmp/o/ab.jsonl 2> /tmp/o/ab.err
tail -1 /tmp/o/ab.err
python3 -c "
import json
for l in open('/tmp/o/ab.jsonl'):
    r = json.loads(l); k = r['kernels_ms']
    print(json.dumps(r['cfg']), round(r['fwd_ms'], 3), round(r['bwd_ms'], 3), {n[:12]: round(v, 3) for n, v in list(k.items())[:3]})
"
tar czf $OUT/s7i.tgz -C /tmp o
