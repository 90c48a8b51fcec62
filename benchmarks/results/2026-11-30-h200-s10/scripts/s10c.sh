# Session 10, call 3: the forward issues its next scores after reading this tile's (no loop-carried moves), and dQ
# issues its next S and dP as this step's are read. Bitwise vs the Triton kernels (gpu tests of fwd and bwd), then
# interleaved A/B against 212c4d1's kernels (scratch/calls/old_fwd_gluon.py, old_dq_gluon.py).
set -u
date -u; nvidia-smi -L
python3 -c "import torch,triton;print('torch',torch.__version__,'triton',triton.__version__)"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p /tmp/o
W=eq4x4k,eq8x8k,skew8k+32x256,skew8k+224x256,logu11-16k,logu29-64k
timeout 240 python3 -m pytest -q -m gpu tests/test_kernel_fwd.py tests/test_kernel_bwd.py > /tmp/o/gpu_tests.log 2>&1; tail -1 /tmp/o/gpu_tests.log
grep -E "FAILED|Error" /tmp/o/gpu_tests.log | head -5
timeout 150 python3 scratch/calls/ab5.py fwd '[{"name":"new"},{"name":"old","swap":[["attn_fwd","attn_fwd_gluon_kernel","scratch/calls/old_fwd_gluon.py"]]}]' $W 5 > /tmp/o/ab5_fwd.jsonl 2> /tmp/o/ab5_fwd.err
cat /tmp/o/ab5_fwd.jsonl; tail -2 /tmp/o/ab5_fwd.err
timeout 150 python3 scratch/calls/ab5.py bwd '[{"name":"new"},{"name":"old","swap":[["attn_bwd","dq_gluon_kernel","scratch/calls/old_dq_gluon.py"]]}]' $W 5 > /tmp/o/ab5_dq.jsonl 2> /tmp/o/ab5_dq.err
cat /tmp/o/ab5_dq.jsonl; tail -2 /tmp/o/ab5_dq.err
tar czf $OUT/s10c.tgz -C /tmp o
