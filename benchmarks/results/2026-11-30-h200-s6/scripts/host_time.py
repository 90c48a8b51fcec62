"""Host time of one eager training call (logu11-16k and eq4x4k): the CPU time to enqueue N calls
while the GPU is kept from running (a long sleep kernel first), so nothing waits on the GPU;
then eager wall per call for N = 1, 4, 20 (cuda events), through the API and straight."""
import time, torch
from flamia import flash_attn_varlen_func
from flamia.kernels.ops import triton_attention
from flamia.bench.workloads import WORKLOADS, make_case
from flamia.bench.jobs import autograd_job
from flamia.bench.timing import cuda_clock
for name in ("logu11-16k", "eq4x4k"):
    i = make_case(WORKLOADS[name], "cuda").inputs
    args = (i.cu_seqlens, i.cu_seqlens, i.max_seqlen, i.max_seqlen)
    for label, fn in (("api", lambda q, k, v: flash_attn_varlen_func(q, k, v, *args, causal=True)),
                      ("direct", lambda q, k, v: triton_attention(q, k, v, *args, causal=True))):
        job = autograd_job(fn, i, "train")
        for _ in range(3): job()
        torch.cuda.synchronize()
        torch.cuda._sleep(2_000_000_000)  # ~1 s of GPU spin: the enqueues below never wait on kernels
        t0 = time.perf_counter()
        for _ in range(8): job()
        host = (time.perf_counter() - t0) / 8 * 1e3
        torch.cuda.synchronize()
        walls = {n: cuda_clock(job, n) for n in (1, 4, 20)}
        print(f"{name:12s} {label:6s} host {host:.3f} ms/call; eager wall " +
              ", ".join(f"N={n}: {ms:.3f}" for n, ms in walls.items()), flush=True)
