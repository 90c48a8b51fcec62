# Session 8, call 4: GPU tests of the Gluon forward (+ prefetched key words) and the dQ kernel's block key words; A/B vs HEAD.
set -u
date -u
export PYTHONUNBUFFERED=1
mkdir -p /tmp/o
export PYTHONPATH=$PWD
timeout 150 python3 -m pytest -q -m gpu tests/ --ignore=tests/test_peer_attention.py 2>&1 | tail -3 | tee /tmp/o/gpu_tests.txt
timeout 60 python3 -m pytest -q tests/test_kernel_quantize.py tests/test_records.py tests/test_kernel_prefix.py tests/test_worklist.py 2>&1 | tail -1 | tee /tmp/o/kernel_tests.txt
timeout 150 python3 benchmarks/kernel_check.py --skip tune,sass,speed --out /tmp/o/kc > /tmp/o/kc.log 2>&1; grep -v Warn /tmp/o/kc.log | grep "^correctness\|^graph" | cut -c1-400
timeout 150 python3 scratch/calls/ab.py $PWD now '[{},{"dq_stages":4},{"dq_stages":2}]' eq8x8k,logu29-64k > /tmp/o/ab.jsonl 2> /tmp/o/ab.err
(cd scratch/calls/t_old && timeout 80 python3 ../ab.py $PWD head '[{}]' eq8x8k,logu29-64k >> /tmp/o/ab.jsonl 2>> /tmp/o/ab.err)
tail -2 /tmp/o/ab.err
python3 -c "
import json
for l in open('/tmp/o/ab.jsonl'):
    r = json.loads(l); k = r['kernels_ms']
    print(r['tag'], r['workload'], json.dumps(r['cfg']), 'fwd', round(r['fwd_ms'], 3), 'bwd', round(r['bwd_ms'], 3), {n[:14]: round(v, 3) for n, v in list(k.items())[:4]})
"
tar czf $OUT/s8d.tgz -C /tmp o
