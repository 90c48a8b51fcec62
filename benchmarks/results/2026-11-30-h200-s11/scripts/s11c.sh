# Session 11, call 3: T_ALIGN 32 and the rotated quantizer's transposed codes in pieces (uncommitted tree).
# GPU 0: every gpu test, kernel_check (correctness, speed incl. quantizer TB/s, profile). GPU 1: qab.py A/B.
set -u
date -u; nvidia-smi -L
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p /tmp/o
( export CUDA_VISIBLE_DEVICES=0
timeout 330 python3 -m pytest -q -m gpu tests/ --ignore=tests/test_peer_attention.py > /tmp/o/gpu_tests.log 2>&1; tail -1 /tmp/o/gpu_tests.log
grep -E "FAILED|Error" /tmp/o/gpu_tests.log | head -5
timeout 150 python3 benchmarks/kernel_check.py --skip tune,sass --out /tmp/o/kc > /tmp/o/kc.log 2>&1
grep -v Warn /tmp/o/kc.log | grep "^correctness" | cut -c1-330
python3 - <<'PY'
import json
d = json.load(open("/tmp/o/kc/kernel_check.json"))
for r in d["speed"]:
    print(r["workload"], "train", round(r["train"], 3), "fwd", round(r["fwd_kernel"], 3), "bwd", round(r["bwd_kernel"], 3),
          "quant_qkv", round(r["quant_qkv"], 4), "TB/s", round(r["quant_TBps"], 3))
PY
) > /tmp/o/gpu0.out 2>&1 &
export CUDA_VISIBLE_DEVICES=1
timeout 300 python3 scratch/calls/qab.py eq4x4k,eq8x8k,skew8k+32x256,skew8k+224x256,logu11-16k,logu29-64k 3 > /tmp/o/qab.jsonl 2> /tmp/o/qab.err
cat /tmp/o/qab.jsonl; tail -3 /tmp/o/qab.err
wait; cat /tmp/o/gpu0.out
tar czf $OUT/s11c.tgz -C /tmp o
