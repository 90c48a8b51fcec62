"""FlashAttention-4 (CuTe DSL, package flash-attn-4): varlen BF16 forward and backward.

On sm_90 it runs its Hopper kernels (its FP8 path is sm_100 only). The first call of each
shape compiles (seconds); the job's warm-up calls absorb that.
"""
from .jobs import autograd_job
from .timing import Job
from .workloads import Case


def fa4_job(case: Case, mode: str) -> Job:
    from flash_attn.cute import flash_attn_varlen_func

    i = case.inputs

    def attention(q, k, v):
        result = flash_attn_varlen_func(q, k, v, cu_seqlens_q=i.cu_seqlens, cu_seqlens_k=i.cu_seqlens,
                                        max_seqlen_q=i.max_seqlen, max_seqlen_k=i.max_seqlen,
                                        causal=case.workload.causal)
        # The 4.0 betas return (out, lse), lse None unless asked for.
        return result[0] if isinstance(result, tuple) else result

    return autograd_job(attention, i, mode)
