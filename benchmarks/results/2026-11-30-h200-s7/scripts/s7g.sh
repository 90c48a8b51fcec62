# Session 7, call 7: rq records (HEAD) against 74b5396. GPU 0: CUDA kernel tests, GPU tests, kernel_check correctness.
# GPU 1: per-kernel A/B.
set -u
date -u
export PYTHONUNBUFFERED=1
mkdir -p /tmp/o
(export CUDA_VISIBLE_DEVICES=1
 W=eq8x8k,logu11-16k,skew8k+224x256
 for r in 1 2; do
   timeout 60 python3 scratch/calls/ab.py $PWD/scratch/calls/t_old old '[{}]' $W >> /tmp/o/ab.jsonl 2>> /tmp/o/ab.err
   timeout 60 python3 scratch/calls/ab.py $PWD rq '[{}]' $W >> /tmp/o/ab.jsonl 2>> /tmp/o/ab.err
 done) &
export CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$PWD
timeout 60 python3 -m pytest -q tests/test_records.py tests/test_kernel_ops.py > /tmp/o/kernels_gpu.log 2>&1; tail -1 /tmp/o/kernels_gpu.log
timeout 90 python3 -m pytest -q -m gpu tests/ --ignore=tests/test_peer_attention.py > /tmp/o/gpu_tests_all.log 2>&1; tail -1 /tmp/o/gpu_tests_all.log
timeout 90 python3 benchmarks/kernel_check.py --skip tune,sass,profile,speed --out /tmp/o/kc > /tmp/o/kc.log 2>&1
grep -v Warn /tmp/o/kc.log | grep "^correctness\|^graph" | cut -c1-330
wait
tail -2 /tmp/o/ab.err
python3 - <<'PY'
import json, collections
rows = [json.loads(l) for l in open("/tmp/o/ab.jsonl")]
agg = collections.defaultdict(list)
for r in rows: agg[(r["workload"], r["tag"])].append(r)
for (w, t), v in sorted(agg.items()):
    k = collections.Counter()
    for r in v:
        for n, x in r["kernels_ms"].items(): k[n] += x / len(v)
    short = {n.split("_kernel")[0].lstrip("_")[:10]: round(x, 3) for n, x in k.most_common(3)}
    print(f"{w[:14]:14s} {t:4s} n{len(v)} fwd {sum(r['fwd_ms'] for r in v)/len(v):.3f} bwd {sum(r['bwd_ms'] for r in v)/len(v):.3f} {short}")
PY
tar czf $OUT/s7g.tgz -C /tmp o
