# Session 12, call 1 (prepared in session 11): run from a checkout of branch next/score-factor-product.
# GPU 0: every gpu test (the Gluon dQ and dK/dV against their Triton twins bit for bit), kernel_check.
# GPU 1: interleaved kernel-only backward A/B against main's dQ and dK/dV (scratch/calls/main_*; made with git show
# main:..., their bwd_math import renamed _main_bwd_math).
set -u
date -u; nvidia-smi -L
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p /tmp/o
W=eq4x4k,eq8x8k,skew8k+32x256,skew8k+224x256,logu11-16k,logu29-64k
( export CUDA_VISIBLE_DEVICES=0
timeout 330 python3 -m pytest -q -m gpu tests/ --ignore=tests/test_peer_attention.py > /tmp/o/gpu_tests.log 2>&1; tail -1 /tmp/o/gpu_tests.log
grep -E "FAILED|Error" /tmp/o/gpu_tests.log | head -5
timeout 150 python3 benchmarks/kernel_check.py --skip tune,sass --out /tmp/o/kc > /tmp/o/kc.log 2>&1
grep -v Warn /tmp/o/kc.log | grep "^correctness" | cut -c1-330
) > /tmp/o/gpu0.out 2>&1 &
export CUDA_VISIBLE_DEVICES=1
C=scratch/calls
timeout 250 python3 $C/ab5.py bwd '[{"name":"branch"},{"name":"main","modules":[["_main_bwd_math","'$C'/main_bwd_math.py"]],"swap":[["attn_bwd","dkdv_gluon_kernel","'$C'/main_dkdv_gluon.py"],["attn_bwd","dq_gluon_kernel","'$C'/main_dq_gluon.py"]]}]' $W 5 > /tmp/o/ab5_bwd.jsonl 2> /tmp/o/ab5_bwd.err
cut -c1-160 /tmp/o/ab5_bwd.jsonl; tail -1 /tmp/o/ab5_bwd.err
wait; cat /tmp/o/gpu0.out
tar czf $OUT/s12a.tgz -C /tmp o
