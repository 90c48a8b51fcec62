# Session 6, call 6: exponents packed as fp32 exponent fields (records.py; bitwise-neutral). GPU 0: GPU tests,
# kernel tests on CUDA, kernel_check. GPU 1: per-kernel A/B against HEAD (32c5bcd), then the FA4 and torch sets,
# training call, each provider alone, clocks logged.
set -u
date -u; nvidia-smi -L
export PYTHONUNBUFFERED=1
mkdir -p /tmp/o /tmp/bundles && cp peer-bundles/fa4_cutlass_cu13_py312.tar.xz /tmp/bundles/
B=/tmp/bundles/fa4_cutlass_cu13_py312.tar.xz
(export CUDA_VISIBLE_DEVICES=1
 W=eq8x8k,logu11-16k,skew8k+224x256
 for r in 1 2; do
   timeout 60 python3 scratch/calls/ab.py $PWD/scratch/calls/old old '[{}]' $W >> /tmp/o/ab.jsonl 2>> /tmp/o/ab.err
   timeout 60 python3 scratch/calls/ab.py $PWD new '[{}]' $W >> /tmp/o/ab.jsonl 2>> /tmp/o/ab.err
 done
 nvidia-smi dmon -i 1 -s pc -d 1 > /tmp/o/dmon.txt 2>&1 & DM=$!
 BENCH_OUT=/tmp/o/parts timeout 230 benchmarks/run_h200.sh $B --providers flamia:mxfp8,fa4,fa2 --workloads causal --modes train,fwd,bwd,memory --alone > /tmp/o/fa4_set.log 2>&1
 BENCH_OUT=/tmp/o/parts timeout 150 benchmarks/run_h200.sh torch --providers flamia:mxfp8,fa2,sdpa-nested --workloads causal --modes train,memory --alone > /tmp/o/torch_set.log 2>&1
 kill $DM) &
export CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$PWD
timeout 150 python3 -m pytest -q -m gpu tests/ --ignore=tests/test_peer_attention.py > /tmp/o/gpu_tests_all.log 2>&1; tail -2 /tmp/o/gpu_tests_all.log
timeout 90 python3 -m pytest -q tests/test_kernel_prefix.py tests/test_records.py tests/test_worklist.py tests/test_kernel_quantize.py tests/test_kernel_ops.py > /tmp/o/new_kernels_gpu.log 2>&1; tail -2 /tmp/o/new_kernels_gpu.log
timeout 200 python3 benchmarks/kernel_check.py --skip tune --out /tmp/o/kc > /tmp/o/kc.log 2>&1
grep -v Warn /tmp/o/kc.log | grep "^correctness\|^graph\|^|" | cut -c1-300
grep "^profile" /tmp/o/kc.log | cut -c1-250
timeout 60 python3 -m flamia probe > /tmp/o/probe.log 2>&1; tail -1 /tmp/o/probe.log
timeout 60 python3 -m flamia accuracy > /tmp/o/accuracy.log 2>&1; tail -4 /tmp/o/accuracy.log
timeout 60 python3 scratch/calls/host_time.py > /tmp/o/host_time.txt 2>&1; grep -v Warn /tmp/o/host_time.txt
wait
python3 - <<'PY'
import json, collections
rows = [json.loads(l) for l in open("/tmp/o/ab.jsonl")]
agg = collections.defaultdict(list)
for r in rows: agg[(r["workload"], r["tag"])].append(r)
for (w, t), v in sorted(agg.items()):
    k = collections.Counter()
    for r in v:
        for n, x in r["kernels_ms"].items(): k[n] += x / len(v)
    short = {n.split("_kernel")[0].lstrip("_")[:10]: round(x, 3) for n, x in k.most_common(4)}
    print(f"{w[:14]:14s} {t:3s} fwd {sum(r['fwd_ms'] for r in v)/len(v):.3f} bwd {sum(r['bwd_ms'] for r in v)/len(v):.3f} {short}")
PY
for t in fa4 torch; do grep -A9 "## Training call" /tmp/o/parts/$t/results.md | tail -7; done
tar czf $OUT/s6f.tgz -C /tmp o
