# Session 9, call 2: branch next/gluon-dkdv with mul_rn before the rotations: the GPU suite
# (bitwise Gluon == Triton for dK/dV and dQ, the tiny batch, key records through ctx), then
# kernel-only A/B of the Gluon dK/dV's stages and query steps against the Triton kernel.
set -u
date -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p /tmp/o
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
timeout 280 python3 -m pytest -q -m gpu tests/ --ignore=tests/test_peer_attention.py -p no:cacheprovider 2>&1 | tail -15 | tee /tmp/o/tests.txt
timeout 250 python3 scratch/calls/ab.py $PWD dkdv '[{},{"bwd_stages":3},{"bwd_stages":2},{"bwd_block_m":64,"bwd_stages":2},{"dkdv_gluon":false}]' eq8x8k,logu29-64k > /tmp/o/ab.jsonl 2> /tmp/o/ab.err
tail -2 /tmp/o/ab.err
python3 -c "
import json
for l in open('/tmp/o/ab.jsonl'):
    r = json.loads(l); k = r['kernels_ms']
    print(r['tag'], r['workload'], json.dumps(r['cfg']), 'bwd', round(r['bwd_ms'], 3), {n[:14]: round(v, 3) for n, v in list(k.items())[:3]})
"
tar czf $OUT/s9b.tgz -C /tmp o
