# Session 6, call 3: per-kernel A/B of the fp32 factor records (new) against the packed exponents (old,
# = 3af54b8 + dq_warps/dq_stages fields), each with tile variants; the two trees alternate over two GPUs.
set -u
date -u; nvidia-smi -L
export PYTHONUNBUFFERED=1
mkdir -p /tmp/o
W=eq8x8k,logu11-16k,skew8k+224x256
C='[{}, {"bwd_block_n":64,"bwd_warps":4}, {"dq_block_m":64,"dq_warps":4}, {"bwd_block_n":64,"bwd_warps":4,"dq_block_m":64,"dq_warps":4}, {"bwd_block_n":64,"bwd_warps":4,"dq_block_m":64,"dq_warps":4,"dq_stages":4}]'
run() { CUDA_VISIBLE_DEVICES=$1 timeout 270 python3 scratch/calls/ab.py $2 $3 "$C" $W >> /tmp/o/ab_gpu$1.jsonl 2>> /tmp/o/ab_gpu$1.err; }
(run 0 $PWD/scratch/calls/old old; run 0 $PWD new) &
(run 1 $PWD new; run 1 $PWD/scratch/calls/old old) &
wait
python3 - <<'PY'
import json, collections
rows = [json.loads(l) for g in (0, 1) for l in open(f"/tmp/o/ab_gpu{g}.jsonl")]
agg = collections.defaultdict(list)
for r in rows: agg[(r["workload"], json.dumps(r["cfg"]), r["tag"])].append(r)
for (w, c, t), v in sorted(agg.items()):
    k = collections.Counter()
    for r in v:
        for n, x in r["kernels_ms"].items(): k[n] += x / len(v)
    short = {n.split("_kernel")[0].lstrip("_")[:10]: round(x, 3) for n, x in k.most_common(5)}
    print(f"{w[:10]:10s} {t:3s} {c[:70]:70s} fwd {sum(r['fwd_ms'] for r in v)/len(v):.3f} bwd {sum(r['bwd_ms'] for r in v)/len(v):.3f} {short}")
PY
tail -3 /tmp/o/ab_gpu*.err
tar czf $OUT/s6c.tgz -C /tmp o
