# Session 13, call 3: the d=64 tile candidates of call 2 and the dK/dV register cap (3 programs per SM) on all six
# d64 workloads, three on each GPU.
set -u
date -u; nvidia-smi -L
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p /tmp/o
CUDA_VISIBLE_DEVICES=1 timeout 400 python3 scratch/calls/d64tune.py skew8k+224x256-d64,logu11-16k-d64,logu29-64k-d64 5 > /tmp/o/d64b_gpu1.log 2>&1 &
CUDA_VISIBLE_DEVICES=0 timeout 400 python3 scratch/calls/d64tune.py eq4x4k-d64,eq8x8k-d64,skew8k+32x256-d64 5 > /tmp/o/d64b_gpu0.log 2>&1
wait
cat /tmp/o/d64b_gpu0.log /tmp/o/d64b_gpu1.log | grep -v "^json" | grep -v "Warn\|warn"
tar czf $OUT/s13c.tgz -C /tmp o
