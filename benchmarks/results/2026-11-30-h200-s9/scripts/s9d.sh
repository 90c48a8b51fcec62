# Session 9, call 4: the rotated Q/K quantizer with coalesced loads (FQ_LC) and stores (FQ_SC),
# layout changes through shared memory: quantizer tests on CUDA in each mode, then an interleaved
# A/B of the quantizers' CUDA time on the six causal workloads.
set -u
date -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p /tmp/o
for v in "0 0" "1 0" "1 1"; do set -- $v
  FQ_LC=$1 FQ_SC=$2 timeout 120 python3 -m pytest -q -x tests/test_kernel_quantize.py -p no:cacheprovider 2>&1 | tail -2 | sed "s/^/LC=$1 SC=$2: /" | tee -a /tmp/o/tests.txt
done
timeout 300 python3 scratch/calls/ab2.py '[{"name":"row-per-thread"},{"name":"coalesced-load","env":{"FQ_LC":"1"}},{"name":"coalesced-both","env":{"FQ_LC":"1","FQ_SC":"1"}}]' eq4x4k,eq8x8k,skew8k+32x256,skew8k+224x256,logu11-16k,logu29-64k 5 quant > /tmp/o/ab2q.jsonl 2> /tmp/o/ab2q.err
tail -2 /tmp/o/ab2q.err; cat /tmp/o/ab2q.jsonl
tar czf $OUT/s9d.tgz -C /tmp o
