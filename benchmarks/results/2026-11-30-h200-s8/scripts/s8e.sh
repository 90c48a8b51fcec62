# Session 8, call 5: the Gluon dQ kernel, bitwise against the Triton one; A/B; the GPU tests.
set -u
date -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p /tmp/o
timeout 150 python3 -m pytest -q -x -m gpu tests/test_kernel_bwd.py -k gluon 2>&1 | tail -12 | tee /tmp/o/gluon_dq_tests.txt
timeout 150 python3 scratch/calls/ab.py $PWD now '[{},{"dq_gluon":false},{"dq_stages":4},{"dq_stages":2}]' eq8x8k,logu29-64k > /tmp/o/ab.jsonl 2> /tmp/o/ab.err
tail -2 /tmp/o/ab.err
python3 -c "
import json
for l in open('/tmp/o/ab.jsonl'):
    r = json.loads(l); k = r['kernels_ms']
    print(r['tag'], r['workload'], json.dumps(r['cfg']), 'fwd', round(r['fwd_ms'], 3), 'bwd', round(r['bwd_ms'], 3), {n[:14]: round(v, 3) for n, v in list(k.items())[:4]})
"
timeout 200 python3 -m pytest -q -m gpu tests/ --ignore=tests/test_peer_attention.py 2>&1 | tail -2 | tee /tmp/o/gpu_tests.txt
tar czf $OUT/s8e.tgz -C /tmp o
