# Session 8, call 1: the Gluon forward, bitwise against the Triton one; then kernel-only A/B.
set -u
date -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p /tmp/o
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
timeout 240 python3 -m pytest -q -x -m gpu tests/test_kernel_fwd.py -k gluon 2>&1 | tail -15 | tee /tmp/o/gluon_tests.txt
timeout 120 python3 -m pytest -q tests/test_kernel_quantize.py tests/test_kernel_ops.py 2>&1 | tail -4 | tee /tmp/o/quant_tests.txt
timeout 200 python3 scratch/calls/ab.py $PWD s8a '[{"fwd_gluon":false},{},{"fwd_block_n":64},{"fwd_block_n":64,"fwd_gluon":false},{"fwd_stages":2},{"fwd_stages":4}]' eq8x8k,logu29-64k > /tmp/o/ab.jsonl 2> /tmp/o/ab.err
tail -3 /tmp/o/ab.err
python3 -c "
import json
for l in open('/tmp/o/ab.jsonl'):
    r = json.loads(l); k = r['kernels_ms']
    print(r['workload'], json.dumps(r['cfg']), 'fwd', round(r['fwd_ms'], 3), round(r['fwd_tflops']), {n[:14]: round(v, 3) for n, v in list(k.items())[:4]})
"
tar czf $OUT/s8a.tgz -C /tmp o
