# Session 7, call 2: records (38f8be1) and the BF16 dV product (working tree). GPU 0: GPU tests, kernel tests
# on CUDA, kernel_check, probe. GPU 1: per-kernel A/B fold (29b9f6c) / rec (38f8be1) / bf16 dV (tree).
set -u
date -u; nvidia-smi -L
export PYTHONUNBUFFERED=1
mkdir -p /tmp/o
(export CUDA_VISIBLE_DEVICES=1
 W=eq8x8k,logu11-16k,skew8k+224x256
 for r in 1 2; do
   timeout 70 python3 scratch/calls/ab.py $PWD/scratch/calls/t_fold fold '[{}]' $W >> /tmp/o/ab.jsonl 2>> /tmp/o/ab.err
   timeout 70 python3 scratch/calls/ab.py $PWD/scratch/calls/t_rec rec '[{}]' $W >> /tmp/o/ab.jsonl 2>> /tmp/o/ab.err
   timeout 70 python3 scratch/calls/ab.py $PWD bf16dv '[{}]' $W >> /tmp/o/ab.jsonl 2>> /tmp/o/ab.err
 done
 timeout 90 python3 scratch/calls/ab.py $PWD bf16dv '[{"bwd_stages":3},{"bwd_stages":2}]' eq8x8k,logu11-16k >> /tmp/o/ab.jsonl 2>> /tmp/o/ab.err
) &
export CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$PWD
timeout 150 python3 -m pytest -q -m gpu tests/ --ignore=tests/test_peer_attention.py > /tmp/o/gpu_tests_all.log 2>&1; tail -2 /tmp/o/gpu_tests_all.log
timeout 90 python3 -m pytest -q tests/test_kernel_prefix.py tests/test_records.py tests/test_worklist.py tests/test_kernel_quantize.py tests/test_kernel_ops.py > /tmp/o/kernels_gpu.log 2>&1; tail -2 /tmp/o/kernels_gpu.log
timeout 200 python3 benchmarks/kernel_check.py --skip tune,sass --out /tmp/o/kc > /tmp/o/kc.log 2>&1
grep -v Warn /tmp/o/kc.log | grep "^correctness\|^graph\|^|" | cut -c1-420
grep "^profile" /tmp/o/kc.log | cut -c1-250
timeout 60 python3 -m flamia probe > /tmp/o/probe.log 2>&1; tail -1 /tmp/o/probe.log
timeout 60 python3 -m flamia accuracy > /tmp/o/accuracy.log 2>&1; tail -4 /tmp/o/accuracy.log
wait
tail -3 /tmp/o/ab.err
python3 - <<'PY'
import json, collections
rows = [json.loads(l) for l in open("/tmp/o/ab.jsonl")]
agg = collections.defaultdict(list)
for r in rows: agg[(r["workload"], r["tag"], json.dumps(r["cfg"]))].append(r)
for (w, t, c), v in sorted(agg.items()):
    k = collections.Counter()
    for r in v:
        for n, x in r["kernels_ms"].items(): k[n] += x / len(v)
    short = {n.split("_kernel")[0].lstrip("_")[:10]: round(x, 3) for n, x in k.most_common(4)}
    print(f"{w[:14]:14s} {t:6s} {c[:22]:22s} n{len(v)} fwd {sum(r['fwd_ms'] for r in v)/len(v):.3f} bwd {sum(r['bwd_ms'] for r in v)/len(v):.3f} {short}")
PY
tar czf $OUT/s7b.tgz -C /tmp o
