"""Where the eager training call's host time goes (logu11-16k): wall per call eager vs the
GPU time, and torch.profiler's CPU self time per op, top 25, plus the number of CUDA launches."""
import time, torch
from torch.profiler import ProfilerActivity, profile
from flamia.bench.workloads import WORKLOADS, make_case
from flamia.bench.jobs import autograd_job
from flamia.kernels.ops import triton_attention
w = WORKLOADS["logu11-16k"]
i = make_case(w, "cuda").inputs
attn = lambda q, k, v: triton_attention(q, k, v, i.cu_seqlens, i.cu_seqlens, i.max_seqlen, i.max_seqlen, causal=True)
job = autograd_job(attn, i, "train")
for _ in range(5): job()
torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(20): job()
torch.cuda.synchronize()
print(f"eager wall per call {1e3*(time.perf_counter()-t0)/20:.3f} ms")
# host time alone: enqueue 20 calls without waiting (the GPU lags; cap the queue by syncing every 5)
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for _ in range(3): job()
    torch.cuda.synchronize()
ev = prof.key_averages()
rows = sorted(ev, key=lambda e: -e.self_cpu_time_total)[:30]
print(f"{'op':60s} {'calls/call':>10s} {'self cpu us/call':>16s}")
for e in rows:
    print(f"{e.key[:60]:60s} {e.count/3:10.1f} {e.self_cpu_time_total/3:16.1f}")
tot = sum(e.self_cpu_time_total for e in ev) / 3
print(f"total self cpu per call {tot/1e3:.3f} ms")
