# Session 10, call 4: the V fold as p (vf rf) in every kernel (vf rf once per key block), the dK/dV key words per
# block. gpu tests of fwd and bwd, kernel_check (its errors against the emulator must keep every digit), then
# interleaved A/B against 81ede52's kernels and helpers (scratch/calls/old_*.py).
set -u
date -u; nvidia-smi -L
python3 -c "import torch,triton;print('torch',torch.__version__,'triton',triton.__version__)"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p /tmp/o
W=eq4x4k,eq8x8k,skew8k+32x256,skew8k+224x256,logu11-16k,logu29-64k
timeout 240 python3 -m pytest -q -m gpu tests/test_kernel_fwd.py tests/test_kernel_bwd.py > /tmp/o/gpu_tests.log 2>&1; tail -1 /tmp/o/gpu_tests.log
grep -E "FAILED|Error" /tmp/o/gpu_tests.log | head -5
timeout 120 python3 benchmarks/kernel_check.py --skip tune,sass --out /tmp/o/kc > /tmp/o/kc.log 2>&1
grep -v Warn /tmp/o/kc.log | grep "^correctness\|^graph" | cut -c1-330
C=scratch/calls
timeout 120 python3 $C/ab5.py fwd '[{"name":"new"},{"name":"old","modules":[["_old_fwd_math","'$C'/old_fwd_math.py"]],"swap":[["attn_fwd","attn_fwd_gluon_kernel","'$C'/old_fwd_gluon.py"]]}]' $W 5 > /tmp/o/ab5_fwd.jsonl 2> /tmp/o/ab5_fwd.err
cut -c1-140 /tmp/o/ab5_fwd.jsonl; tail -1 /tmp/o/ab5_fwd.err
timeout 150 python3 $C/ab5.py bwd '[{"name":"new"},{"name":"old","modules":[["_old_bwd_math","'$C'/old_bwd_math.py"]],"swap":[["attn_bwd","dkdv_gluon_kernel","'$C'/old_dkdv_gluon.py"],["attn_bwd","dq_gluon_kernel","'$C'/old_dq_gluon.py"]]}]' $W 5 > /tmp/o/ab5_bwd.jsonl 2> /tmp/o/ab5_bwd.err
cut -c1-170 /tmp/o/ab5_bwd.jsonl; tail -1 /tmp/o/ab5_bwd.err
tar czf $OUT/s10d.tgz -C /tmp o
