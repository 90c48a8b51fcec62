# Session 12, call 8: branch next/dq-payload-factor (the dQ payload's key factors folded into rq per row and block).
# GPU 0: the backward and training-call gpu tests. GPU 1: an interleaved kernel-only dQ A/B against main (42152ff).
set -u
date -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p /tmp/o
W=eq4x4k,eq8x8k,skew8k+32x256,skew8k+224x256,logu11-16k,logu29-64k
( export CUDA_VISIBLE_DEVICES=0
timeout 160 python3 -m pytest -q -m gpu tests/test_kernel_bwd.py tests/test_kernel_ops.py > /tmp/o/gpu_tests.log 2>&1; tail -1 /tmp/o/gpu_tests.log
grep -E "FAILED|Error" /tmp/o/gpu_tests.log | head -5 ) > /tmp/o/gpu0.out 2>&1 &
export CUDA_VISIBLE_DEVICES=1
C=scratch/calls
timeout 150 python3 $C/ab5.py bwd '[{"name":"branch"},{"name":"main","modules":[["_main_bwd_math","'$C'/main_bwd_math.py"]],"swap":[["attn_bwd","dq_gluon_kernel","'$C'/main_dq_gluon.py"]]}]' $W 5 > /tmp/o/ab5_bwd.jsonl 2> /tmp/o/ab5_bwd.err
python3 -c "
import json
rows=[json.loads(l) for l in open('/tmp/o/ab5_bwd.jsonl')]
for i in range(0,len(rows),2):
    a,b=rows[i],rows[i+1]
    print(a['workload'], a['cfg'], a['median_ms']['dq_gluon_kernel'], b['cfg'], b['median_ms']['dq_gluon_kernel'], 'dkdv', a['median_ms']['dkdv_gluon_kernel'], b['median_ms']['dkdv_gluon_kernel'])
"; tail -1 /tmp/o/ab5_bwd.err
wait; cat /tmp/o/gpu0.out
tar czf $OUT/s12h.tgz -C /tmp o
