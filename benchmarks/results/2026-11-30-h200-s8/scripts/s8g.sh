# Session 8, call 7: the Gluon dQ with the next step's S and dP queued behind the dQ tile; bitwise + A/B.
set -u
date -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p /tmp/o
timeout 100 python3 -m pytest -q -x -m gpu tests/test_kernel_bwd.py -k "gluon or matches_emulator_gpu" 2>&1 | tail -4 | tee /tmp/o/gluon_dq_tests.txt
timeout 100 python3 scratch/calls/ab.py $PWD overlap '[{},{"dq_gluon":false}]' eq8x8k,logu29-64k > /tmp/o/ab.jsonl 2> /tmp/o/ab.err
tail -1 /tmp/o/ab.err
python3 -c "
import json
for l in open('/tmp/o/ab.jsonl'):
    r = json.loads(l); k = r['kernels_ms']
    print(r['tag'], r['workload'], json.dumps(r['cfg']), 'bwd', round(r['bwd_ms'], 3), {n[:14]: round(v, 3) for n, v in list(k.items())[:3]})
"
tar czf $OUT/s8g.tgz -C /tmp o
