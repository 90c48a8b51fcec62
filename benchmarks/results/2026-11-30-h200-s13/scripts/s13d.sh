# Session 13, call 4: d=64 tiles of branch next/d64-tiles (64-key forward tiles with 4 stages, dQ with 2 stages,
# dK/dV capped at 168 registers): GPU 1 every gpu test; GPU 0 the register caps of 128 (4 programs per SM) and
# the old tiles, on the six d64 workloads.
set -u
date -u; nvidia-smi -L
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p /tmp/o
CUDA_VISIBLE_DEVICES=1 timeout 400 python3 -m pytest -q -m gpu tests/ --ignore=tests/test_peer_attention.py > /tmp/o/gpu_tests_all.log 2>&1 &
CUDA_VISIBLE_DEVICES=0 timeout 400 python3 scratch/calls/d64tune.py eq4x4k-d64,eq8x8k-d64,skew8k+32x256-d64,skew8k+224x256-d64,logu11-16k-d64,logu29-64k-d64 5 > /tmp/o/d64c.log 2>&1
grep -v "^json" /tmp/o/d64c.log | grep -v "Warn\|warn"
wait
tail -3 /tmp/o/gpu_tests_all.log
tar czf $OUT/s13d.tgz -C /tmp o
