# Session 9, call 9: dK/dV steps of 64 queries in the Gluon kernel (two 32-query halves of S^T and
# dP^T, dV and dK chained over the step; bwd_block_m 64, 2 stages, Gluon everywhere): the backward
# and training-call GPU tests, kernel_check's correctness and graph, an interleaved A/B against the
# shipped Triton kernel at 32-query steps.
set -u
date -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p /tmp/o/kc
timeout 170 python3 -m pytest -q -m gpu tests/test_kernel_bwd.py tests/test_kernel_ops.py -p no:cacheprovider 2>&1 | tail -3 | tee /tmp/o/tests.txt
timeout 60 python3 benchmarks/kernel_check.py --skip tune,sass,speed,profile --out /tmp/o/kc > /tmp/o/kc.log 2>&1; grep "^correctness\|^graph" /tmp/o/kc.log | cut -c1-420
timeout 130 python3 scratch/calls/ab2.py '[{"name":"gluon64","tiles":{"bwd_block_m":64,"bwd_stages":2,"dkdv_gluon_below":1073741824}},{"name":"triton32","tiles":{"bwd_block_m":32,"bwd_stages":4,"dkdv_gluon":false}},{"name":"gluon32","tiles":{"bwd_block_m":32,"bwd_stages":4,"dkdv_gluon_below":1073741824}}]' eq4x4k,eq8x8k,skew8k+224x256,logu11-16k,logu29-64k 3 > /tmp/o/ab2.jsonl 2> /tmp/o/ab2.err
tail -1 /tmp/o/ab2.err; cat /tmp/o/ab2.jsonl | cut -c1-200
tar czf $OUT/s9i.tgz -C /tmp o
