# Session 9, call 8: branch next/dkdv-producer at 4 MMA warps + 1 TMA producer warp, 64-key tiles
# (setmaxnreg 256/24: one program per SM), as a scratch tree: bitwise test, then an interleaved A/B
# against the Triton kernel. A hang is cut by the timeouts.
set -u
date -u
export PYTHONUNBUFFERED=1
mkdir -p /tmp/o
cd scratch/calls/t_prod
export PYTHONPATH=$PWD
timeout 150 python3 -m pytest -q -m gpu tests/test_kernel_bwd.py -k "gluon_dkdv" -p no:cacheprovider 2>&1 | tail -3 | tee /tmp/o/tests.txt
timeout 150 python3 ../ab2.py '[{"name":"producer"},{"name":"triton","tiles":{"dkdv_gluon":false}}]' eq8x8k,logu29-64k,skew8k+224x256 3 > /tmp/o/ab2.jsonl 2> /tmp/o/ab2.err
echo "rc=$?"; tail -2 /tmp/o/ab2.err; cat /tmp/o/ab2.jsonl
tar czf $OUT/s9h.tgz -C /tmp o
