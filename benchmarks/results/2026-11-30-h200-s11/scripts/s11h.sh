# Session 11, call 8: dK/dV reading each half's query records before waiting for its products (session 10's
# call8_early_records.patch on 406b272; offline now without spills in the loop). GPU 0: the backward gpu tests.
# GPU 1: interleaved kernel-only A/B against 406b272's dK/dV (scratch/calls/dkdv_head.py).
set -u
date -u; nvidia-smi -L
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p /tmp/o
W=eq4x4k,eq8x8k,skew8k+32x256,skew8k+224x256,logu11-16k,logu29-64k
(CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m pytest -q -m gpu tests/test_kernel_bwd.py tests/test_kernel_ops.py > /tmp/o/gpu_tests.log 2>&1; tail -1 /tmp/o/gpu_tests.log; grep -E "FAILED|Error" /tmp/o/gpu_tests.log | head -5) > /tmp/o/gpu0.out 2>&1 &
C=scratch/calls
CUDA_VISIBLE_DEVICES=1 timeout 200 python3 $C/ab5.py bwd '[{"name":"head","swap":[["attn_bwd","dkdv_gluon_kernel","'$C'/dkdv_head.py"]]},{"name":"early"}]' $W 5 > /tmp/o/ab5_bwd.jsonl 2> /tmp/o/ab5_bwd.err
cut -c1-150 /tmp/o/ab5_bwd.jsonl; tail -1 /tmp/o/ab5_bwd.err
wait; cat /tmp/o/gpu0.out
tar czf $OUT/s11h.tgz -C /tmp o
