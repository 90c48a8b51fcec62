"""p_fold_exp2 on the GPU: the Gluon kernels against the emulator on a packed case, then the
training call and the forward alone, CUDA-graphed, mxfp8 and mxfp8 with the fold alternating."""
import torch
from flamia.bench.jobs import autograd_job
from flamia.bench.timing import capture_graph, cuda_clock
from flamia.bench.workloads import WORKLOADS, make_case
from flamia.recipes import Recipe
from flamia.workload import as_attention, make_packed_inputs, training_call

FOLD = Recipe("mxfp8", p_fold_exp2=True)
i = make_packed_inputs((1000, 333, 1, 700), 16, 16, 128, device="cuda", seed=3)
got = training_call(as_attention(FOLD, "triton"), i).by_name()
want = training_call(as_attention(FOLD, "reference"), i).by_name()
print("kernels vs emulator, relative norm:", {n: round(((got[n].float() - want[n].float()).norm() / want[n].float().norm()).item(), 5)
                                              for n in ("O", "dQ", "dK", "dV")}, flush=True)


def timed(job):
    g = capture_graph(job)
    cuda_clock(g, 3)
    return min(cuda_clock(g, 10) for _ in range(3))


with torch.cuda.stream(torch.cuda.Stream()):
    for name in ("eq8x8k", "logu11-16k", "logu29-64k"):
        case = make_case(WORKLOADS[name], "cuda")
        c = case.inputs
        for recipe in ("mxfp8", FOLD, "mxfp8", FOLD):
            attn = as_attention(recipe, "triton")

            def call(q, k, v):
                return attn(q, k, v, c.cu_seqlens, c.cu_seqlens, c.max_seqlen, c.max_seqlen, True)[0]
            print(f"{name:12s} {'fold' if recipe is FOLD else 'main'} train {timed(autograd_job(call, c, 'train')):.3f} "
                  f"fwd {timed(autograd_job(call, c, 'fwd')):.3f} ms", flush=True)
        del case
        torch.cuda.empty_cache()
