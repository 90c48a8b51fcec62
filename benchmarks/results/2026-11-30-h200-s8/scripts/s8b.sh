# Session 8, call 2: Gluon forward with per-block key factors (no spills) + the fused exp2 argument.
set -u
date -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p /tmp/o
timeout 200 python3 -m pytest -q -x tests/test_kernel_fwd.py 2>&1 | tail -4 | tee /tmp/o/fwd_tests.txt
timeout 100 python3 -m pytest -q tests/test_kernel_ops.py 2>&1 | tail -2 | tee /tmp/o/ops_tests.txt
timeout 200 python3 scratch/calls/ab.py $PWD s8b '[{"fwd_gluon":false},{},{"fwd_block_n":64},{"fwd_stages":2},{"fwd_block_n":64,"fwd_stages":4}]' eq8x8k,logu29-64k,skew8k+224x256 > /tmp/o/ab.jsonl 2> /tmp/o/ab.err
tail -3 /tmp/o/ab.err
python3 -c "
import json
for l in open('/tmp/o/ab.jsonl'):
    r = json.loads(l); k = r['kernels_ms']
    print(r['workload'], json.dumps(r['cfg']), 'fwd', round(r['fwd_ms'], 3), round(r['fwd_tflops']), {n[:14]: round(v, 3) for n, v in list(k.items())[:4] if 'fwd' in n})
"
tar czf $OUT/s8b.tgz -C /tmp o
