# Session 12, call 5: branch next/dq-mask-on-scores (the dQ masks S to -inf before the fused factor; rows and keys
# past the document read 2^0 factors). GPU 0: every gpu test, kernel_check. GPU 1: interleaved kernel-only dQ A/B
# against main's (9b3d418) dQ and bwd_math (scratch/calls/main_*), twice.
set -u
date -u; nvidia-smi -L
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p /tmp/o
W=eq4x4k,eq8x8k,skew8k+32x256,skew8k+224x256,logu11-16k,logu29-64k
( export CUDA_VISIBLE_DEVICES=0
timeout 300 python3 -m pytest -q -m gpu tests/ --ignore=tests/test_peer_attention.py > /tmp/o/gpu_tests.log 2>&1; tail -1 /tmp/o/gpu_tests.log
grep -E "FAILED|Error" /tmp/o/gpu_tests.log | head -5
timeout 60 python3 benchmarks/kernel_check.py --skip tune,sass,speed,profile,graph --out /tmp/o/kc > /tmp/o/kc.log 2>&1
grep -v Warn /tmp/o/kc.log | grep "^correctness" | cut -c1-330
) > /tmp/o/gpu0.out 2>&1 &
export CUDA_VISIBLE_DEVICES=1
C=scratch/calls
for r in 1 2; do
timeout 120 python3 $C/ab5.py bwd '[{"name":"branch"},{"name":"main","modules":[["_main_bwd_math","'$C'/main_bwd_math.py"]],"swap":[["attn_bwd","dq_gluon_kernel","'$C'/main_dq_gluon.py"]]}]' $W 5 > /tmp/o/ab5_bwd_$r.jsonl 2> /tmp/o/ab5_bwd_$r.err
python3 -c "
import json,sys
rows=[json.loads(l) for l in open('/tmp/o/ab5_bwd_$r.jsonl')]
for i in range(0,len(rows),2):
    a,b=rows[i],rows[i+1]
    print(a['workload'], a['cfg'], a['median_ms']['dq_gluon_kernel'], b['cfg'], b['median_ms']['dq_gluon_kernel'], 'dkdv', a['median_ms']['dkdv_gluon_kernel'], b['median_ms']['dkdv_gluon_kernel'])
"; tail -1 /tmp/o/ab5_bwd_$r.err
done
wait; cat /tmp/o/gpu0.out
tar czf $OUT/s12e.tgz -C /tmp o
