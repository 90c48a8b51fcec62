"""Session 11: where a graphed training call's time goes beyond its kernels' CUDA time (eq8x8k, flamia).
Replays the captured call; (1) cuda_clock per replay over 1 and over 50 back-to-back replays; (2) a chrome trace
of 3 replays: the span of each replay, the sum of its kernel durations, and the largest idle gaps between kernels."""
import json, os, sys, time
import torch
from torch.profiler import ProfilerActivity, profile
from flamia.bench.jobs import autograd_job
from flamia.bench.timing import capture_graph, cuda_clock
from flamia.bench.workloads import WORKLOADS, make_case
from flamia.kernels.ops import triton_attention

name = sys.argv[1] if len(sys.argv) > 1 else "eq8x8k"
w = WORKLOADS[name]
i = make_case(w, "cuda").inputs
with torch.cuda.stream(torch.cuda.Stream()):
    attn = lambda q, k, v: triton_attention(q, k, v, i.cu_seqlens, i.cu_seqlens, i.max_seqlen, i.max_seqlen,
                                            causal=w.causal)
    g = capture_graph(autograd_job(attn, i, "train"))
    out = {"workload": name}
    for n in (1, 2, 50, 2):
        out[f"ms_per_replay_{n}"] = round(cuda_clock(g, n), 3)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            g()
        torch.cuda.synchronize()
    prof.export_chrome_trace("/tmp/o/trace.json")
ev = [e for e in json.load(open("/tmp/o/trace.json"))["traceEvents"] if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")]
ev.sort(key=lambda e: e["ts"])
per = len(ev) // 3
out["events_per_replay"] = per
reps = [ev[r * per:(r + 1) * per] for r in range(3)]
spans, busy, gaps = [], [], []
for rep in reps:
    spans.append((rep[-1]["ts"] + rep[-1]["dur"] - rep[0]["ts"]) / 1e3)
    busy.append(sum(e["dur"] for e in rep) / 1e3)
    for a, b in zip(rep, rep[1:]):
        gaps.append((b["ts"] - (a["ts"] + a["dur"]), a["name"][:28], b["name"][:28]))
out["span_ms"] = [round(x, 3) for x in spans]
out["kernel_ms"] = [round(x, 3) for x in busy]
gaps.sort(reverse=True)
out["gap_total_us_per_replay"] = round(sum(g[0] for g in gaps) / 3, 1)
out["largest_gaps_us"] = [(round(g[0], 1), g[1], g[2]) for g in gaps[:8]]
out["kernels_us"] = [(e["name"][:28], round(e["dur"], 1)) for e in reps[1]]
print(json.dumps(out), flush=True)
