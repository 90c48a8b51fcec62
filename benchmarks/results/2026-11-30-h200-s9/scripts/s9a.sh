# Session 9, call 1: branch next/gluon-dkdv on the GPU: bitwise Gluon dK/dV vs Triton; the training
# call's GPU tests (tiny batch, key records shared through ctx); kernel-only A/B; kernel_check.
set -u
date -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p /tmp/o/kc
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
timeout 200 python3 -m pytest -q -m gpu tests/test_kernel_bwd.py tests/test_kernel_ops.py 2>&1 | tail -25 | tee /tmp/o/tests.txt
timeout 150 python3 scratch/calls/ab.py $PWD dkdv '[{},{"dkdv_gluon":false}]' eq8x8k,logu29-64k > /tmp/o/ab.jsonl 2> /tmp/o/ab.err
tail -2 /tmp/o/ab.err
python3 -c "
import json
for l in open('/tmp/o/ab.jsonl'):
    r = json.loads(l); k = r['kernels_ms']
    print(r['tag'], r['workload'], json.dumps(r['cfg']), 'bwd', round(r['bwd_ms'], 3), {n[:14]: round(v, 3) for n, v in list(k.items())[:4]})
"
timeout 150 python3 benchmarks/kernel_check.py --skip tune,sass,speed,profile --out /tmp/o/kc > /tmp/o/kc.txt 2>&1; tail -20 /tmp/o/kc.txt
tar czf $OUT/s9a.tgz -C /tmp o
