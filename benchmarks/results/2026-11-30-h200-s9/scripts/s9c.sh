# Session 9, call 3: Gluon dK/dV with the next step's S/dP issued before the dK payload
# (FLAMIA_DKDV_EARLY=1, a scratch switch): bitwise test, then an interleaved A/B (5 rounds) on the
# six causal workloads against the present Gluon loop and the Triton kernel.
set -u
date -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p /tmp/o
FLAMIA_DKDV_EARLY=1 timeout 150 python3 -m pytest -q -m gpu tests/test_kernel_bwd.py -k gluon_dkdv -p no:cacheprovider 2>&1 | tail -3 | tee /tmp/o/tests.txt
timeout 400 python3 scratch/calls/ab2.py '[{"name":"gluon"},{"name":"gluon-early","env":{"FLAMIA_DKDV_EARLY":"1"}},{"name":"triton","tiles":{"dkdv_gluon":false}}]' eq4x4k,eq8x8k,skew8k+32x256,skew8k+224x256,logu11-16k,logu29-64k 5 > /tmp/o/ab2.jsonl 2> /tmp/o/ab2.err
tail -2 /tmp/o/ab2.err; cat /tmp/o/ab2.jsonl
tar czf $OUT/s9c.tgz -C /tmp o
