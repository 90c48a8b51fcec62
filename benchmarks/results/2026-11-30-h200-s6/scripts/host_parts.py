"""Host time per stage of one eager training call on logu11-16k, the GPU kept busy by a sleep
kernel so no host call waits on it: every launcher and torch glue function of ops.py, and every
Triton launch (JITFunction.run), wrapped with a perf_counter accumulator. Nested entries include
their children."""
import time, collections, functools, torch, triton
from triton.runtime.jit import JITFunction
import flamia.kernels.ops as ops, flamia.kernels.attn_fwd as af, flamia.kernels.attn_bwd as ab, flamia.kernels.quantize as qz
from flamia.bench.workloads import WORKLOADS, make_case
from flamia.bench.jobs import autograd_job
acc = collections.defaultdict(float); cnt = collections.Counter(); on = [False]
def timed(name, f):
    @functools.wraps(f)
    def g(*a, **k):
        t0 = time.perf_counter(); r = f(*a, **k)
        if on[0]: acc[name] += time.perf_counter() - t0; cnt[name] += 1
        return r
    return g
for mod, names in ((ops, ["quantize_operand", "quantize_grad_output", "prefix_v_exponent", "attention_forward",
                          "attention_backward", "aligned_starts"]),
                   (af, ["tile_list", "key_records"]), (ab, ["tile_list", "key_records", "query_records"]),
                   (qz, ["tile_list"])):
    for n in names:
        setattr(mod, n, timed(f"{mod.__name__.split('.')[-1]}.{n}", getattr(mod, n)))
run0 = JITFunction.run
def run(self, *a, **k):
    t0 = time.perf_counter(); r = run0(self, *a, **k)
    if on[0]: acc["triton." + self.fn.__name__] += time.perf_counter() - t0; cnt["triton." + self.fn.__name__] += 1
    return r
JITFunction.run = run
fwd0, bwd0 = ops._TritonAttention.forward, ops._TritonAttention.backward
ops._TritonAttention.forward = staticmethod(timed("Function.forward", fwd0))
ops._TritonAttention.backward = staticmethod(timed("Function.backward", bwd0))
i = make_case(WORKLOADS["logu11-16k"], "cuda").inputs
job = autograd_job(lambda q, k, v: ops.triton_attention(q, k, v, i.cu_seqlens, i.cu_seqlens, i.max_seqlen, i.max_seqlen,
                                                         causal=True), i, "train")
for _ in range(3): job()
torch.cuda.synchronize()
N = 8
torch.cuda._sleep(2_000_000_000)
on[0] = True
t0 = time.perf_counter()
for _ in range(N): job()
total = time.perf_counter() - t0
on[0] = False
torch.cuda.synchronize()
print(f"whole call {1e3 * total / N:.3f} ms host")
for name, s in sorted(acc.items(), key=lambda kv: -kv[1]):
    print(f"  {name:40s} {cnt[name] / N:4.1f}/call {1e3 * s / N:8.3f} ms/call {1e6 * s / cnt[name]:8.1f} us each")
