# Session 6, call 2: fp32 factor records (bitwise-neutral), dQ warps/stages as their own fields.
# GPU 0: GPU tests + kernel_check correctness/graph/SASS. GPU 1: kernel-only A/B, old (HEAD 3af54b8) vs new, tile variants.
set -u
date -u; nvidia-smi -L
export PYTHONUNBUFFERED=1
mkdir -p /tmp/o
(export CUDA_VISIBLE_DEVICES=1
 W=eq8x8k,logu11-16k,skew8k+224x256
 C='[{}, {"bwd_block_n":64,"bwd_warps":4}, {"bwd_block_n":64,"bwd_warps":4,"bwd_stages":2}, {"dq_block_m":64,"dq_warps":4}, {"dq_block_m":64,"dq_warps":4,"dq_stages":2}, {"bwd_block_n":64,"bwd_warps":4,"dq_block_m":64,"dq_warps":4}]'
 for r in 1 2; do
   timeout 120 python3 scratch/calls/ab.py $PWD/scratch/calls/old old '[{}]' $W >> /tmp/o/ab.jsonl 2>> /tmp/o/ab.err
   timeout 200 python3 scratch/calls/ab.py $PWD new "$C" $W >> /tmp/o/ab.jsonl 2>> /tmp/o/ab.err
 done) &
export CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$PWD
timeout 200 python3 -m pytest -q -m gpu tests/ --ignore=tests/test_peer_attention.py > /tmp/o/gpu_tests_all.log 2>&1; tail -2 /tmp/o/gpu_tests_all.log
timeout 90 python3 -m pytest -q tests/test_kernel_prefix.py tests/test_records.py tests/test_worklist.py tests/test_kernel_quantize.py tests/test_kernel_ops.py > /tmp/o/new_kernels_gpu.log 2>&1; tail -2 /tmp/o/new_kernels_gpu.log
timeout 150 python3 benchmarks/kernel_check.py --skip tune,speed,profile --workloads eq8x8k --out /tmp/o/kc > /tmp/o/kc.log 2>&1
grep -v Warn /tmp/o/kc.log | grep "^correctness\|^graph\|^sass" | cut -c1-400
wait
python3 - <<'PY'
import json, collections
rows = [json.loads(l) for l in open("/tmp/o/ab.jsonl")]
agg = collections.defaultdict(list)
for r in rows: agg[(r["workload"], r["tag"], json.dumps(r["cfg"]))].append((r["fwd_ms"], r["bwd_ms"]))
for (w, t, c), v in sorted(agg.items()):
    print(f"{w:16s} {t:4s} {c:75s} fwd " + " ".join(f"{a:.3f}" for a, _ in v) + "  bwd " + " ".join(f"{b:.3f}" for _, b in v))
PY
tail -3 /tmp/o/ab.err
tar czf $OUT/s6b.tgz -C /tmp o
