# Session 11, call 4: the transposed codes in the wgmma A operand's token order (uncommitted tree; HEAD's package in
# scratch/calls/head). GPU 0: every gpu test, kernel_check. GPU 1: kernel-only fwd and bwd, HEAD against the new tree,
# alternating processes (ab5.py, one config each, 3 rounds per process), twice.
set -u
date -u; nvidia-smi -L
export PYTHONUNBUFFERED=1
mkdir -p /tmp/o
W=eq4x4k,eq8x8k,skew8k+32x256,skew8k+224x256,logu11-16k,logu29-64k
( export CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$PWD
timeout 330 python3 -m pytest -q -m gpu tests/ --ignore=tests/test_peer_attention.py > /tmp/o/gpu_tests.log 2>&1; tail -1 /tmp/o/gpu_tests.log
grep -E "FAILED|Error" /tmp/o/gpu_tests.log | head -8
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
AB=$PWD/scratch/calls/ab5.py
for rep in 1 2; do for mode in fwd bwd; do
  (cd scratch/calls/head && PYTHONPATH=$PWD timeout 120 python3 $AB $mode '[{"name":"head"}]' $W 3 >> /tmp/o/ab_$mode.jsonl 2>> /tmp/o/ab.err)
  PYTHONPATH=$PWD timeout 120 python3 $AB $mode '[{"name":"perm"}]' $W 3 >> /tmp/o/ab_$mode.jsonl 2>> /tmp/o/ab.err
done; done
python3 - <<'PY'
import collections, json, statistics
for mode in ("fwd", "bwd"):
    t = collections.defaultdict(list)
    for l in open(f"/tmp/o/ab_{mode}.jsonl"):
        r = json.loads(l)
        for k, v in r["median_ms"].items():
            if "kernel" in k and not k.startswith("_key") and not k.startswith("_tile") and not k.startswith("_query"):
                t[(r["workload"], k, r["cfg"])].append(v)
    for (w, k, c), v in sorted(t.items()):
        if c == "head":
            n = t.get((w, k, "perm"))
            print(mode, w, k, "head", v, "perm", n, f"{(statistics.median(n) / statistics.median(v) - 1) * 100:+.1f}%" if n else "")
PY
tail -2 /tmp/o/ab.err
wait; cat /tmp/o/gpu0.out
tar czf $OUT/s11d.tgz -C /tmp o
