# Session 10, call 6: dK/dV with a barrier ring per copied operand (3 bar.sync per step instead of 7, 5 waits
# instead of 1). Bitwise vs the Triton kernel, then interleaved A/B against 653e3b9's (old653_dkdv_gluon.py).
set -u
date -u; nvidia-smi -L
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p /tmp/o
W=eq4x4k,eq8x8k,skew8k+32x256,skew8k+224x256,logu11-16k,logu29-64k
timeout 200 python3 -m pytest -q -m gpu tests/test_kernel_bwd.py tests/test_kernel_ops.py -k "gluon_dkdv or matches_emulator_gpu or training_call" > /tmp/o/gpu_tests.log 2>&1; tail -1 /tmp/o/gpu_tests.log
grep -E "FAILED|Error" /tmp/o/gpu_tests.log | head -5
C=scratch/calls
timeout 150 python3 $C/ab5.py bwd '[{"name":"rings"},{"name":"old","swap":[["attn_bwd","dkdv_gluon_kernel","'$C'/old653_dkdv_gluon.py"]]}]' $W 5 > /tmp/o/ab5_bwd.jsonl 2> /tmp/o/ab5_bwd.err
cut -c1-150 /tmp/o/ab5_bwd.jsonl; tail -1 /tmp/o/ab5_bwd.err
tar czf $OUT/s10f.tgz -C /tmp o
