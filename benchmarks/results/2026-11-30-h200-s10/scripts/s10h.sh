# Session 10, call 8: dK/dV reads each half's query records before waiting for its S^T and dP^T
# Bitwise vs the Triton kernel, then interleaved A/B against a7ad450's (olda7_dkdv_gluon.py).
set -u
date -u; nvidia-smi -L
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p /tmp/o
W=eq4x4k,eq8x8k,skew8k+32x256,skew8k+224x256,logu11-16k,logu29-64k
timeout 150 python3 -m pytest -q -m gpu tests/test_kernel_bwd.py tests/test_kernel_ops.py -k "gluon_dkdv" > /tmp/o/gpu_tests.log 2>&1; tail -1 /tmp/o/gpu_tests.log
grep -E "FAILED|Error" /tmp/o/gpu_tests.log | head -5
C=scratch/calls
timeout 150 python3 $C/ab5.py bwd '[{"name":"early"},{"name":"old","swap":[["attn_bwd","dkdv_gluon_kernel","'$C'/olda7_dkdv_gluon.py"]]}]' $W 5 > /tmp/o/ab5_bwd.jsonl 2> /tmp/o/ab5_bwd.err
cut -c1-150 /tmp/o/ab5_bwd.jsonl; tail -1 /tmp/o/ab5_bwd.err
tar czf $OUT/s10h.tgz -C /tmp o
