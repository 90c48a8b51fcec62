# Session 7, call 5: the Gluon rotated quantizer with the transpose moved as fp32: bitwise tests on CUDA, kernel-only timing.
set -u
date -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p /tmp/o
timeout 90 python3 scratch/calls/qgluon.py eq8x8k,skew8k+224x256,logu11-16k,logu29-64k > /tmp/o/qgluon.jsonl 2>/tmp/o/qgluon.err; cat /tmp/o/qgluon.jsonl; tail -2 /tmp/o/qgluon.err
timeout 90 python3 -m pytest -q tests/test_kernel_quantize.py tests/test_kernel_ops.py > /tmp/o/kq.log 2>&1; tail -2 /tmp/o/kq.log
timeout 100 python3 benchmarks/kernel_check.py --skip tune,sass,profile,speed --out /tmp/o/kc > /tmp/o/kc.log 2>&1
grep -v Warn /tmp/o/kc.log | grep "^correctness\|^graph" | cut -c1-300
tar czf $OUT/s7e.tgz -C /tmp o
