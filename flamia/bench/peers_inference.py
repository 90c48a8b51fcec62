"""Forward-only peers: FlashInfer prefill on ragged K/V (BF16, and FP8 with per-tensor
scales) and SageAttention 1 (INT8 Q/K, batched API, so equal-length documents only).

FlashInfer's plan() runs outside the timed region; run() is the timed call. FP8 Q, K and V
are quantized inside the call (``fp8.quantize_per_tensor``) and their descales are passed
per head, the layout the FA3 backend reads; the output is bf16.
"""
import torch

from .fp8 import FP8, quantize_per_tensor
from .jobs import forward_only
from .timing import Job
from .workloads import Case

FLASHINFER_WORKSPACE_BYTES = 256 << 20


def flashinfer_prefill(cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, heads_q: int, heads_kv: int,
                       head_dim: int, causal: bool, fp8: bool, out_dtype: torch.dtype):
    """BatchPrefillWithRaggedKVCacheWrapper, NHD layout, planned for these documents (plan()
    reads cu_seqlens on the host): backend "fa3" for FP8 (the Hopper FP8 path), "auto" for
    BF16. Returns run(q, k, v) -> out [Tq, Hq, D] in out_dtype; FP8 quantizes q, k, v per
    tensor inside the call."""
    import flashinfer

    workspace = torch.zeros(FLASHINFER_WORKSPACE_BYTES, dtype=torch.uint8, device=cu_seqlens_q.device)
    wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD", backend="fa3" if fp8 else "auto")
    data_type = FP8 if fp8 else out_dtype
    wrapper.plan(cu_seqlens_q, cu_seqlens_k, heads_q, heads_kv, head_dim, causal=causal, q_data_type=data_type,
                 kv_data_type=data_type, o_data_type=out_dtype)
    if not fp8:
        return wrapper.run

    def run_fp8(q, k, v):
        quantized = [quantize_per_tensor(x) for x in (q, k, v)]
        codes = [x for x, _ in quantized]
        descales = [d.reshape(1).expand(x.shape[1]).contiguous() for x, d in quantized]  # [heads] fp32
        return wrapper.run(*codes, *descales)

    return run_fp8


def flashinfer_job(case: Case, mode: str, fp8: bool) -> Job:
    """``flashinfer_prefill`` on the case's inputs; plan() runs here, outside the timed region."""
    forward_only(mode)
    i, w = case.inputs, case.workload
    run = flashinfer_prefill(i.cu_seqlens, i.cu_seqlens, w.heads_q, w.heads_kv, w.head_dim, w.causal, fp8,
                             i.q.dtype)
    return lambda: run(i.q, i.k, i.v)


def sage1_job(case: Case, mode: str) -> Job:
    """sageattention.sageattn on [B, S, H, D] views of the packed rows ("NHD" layout)."""
    from sageattention import sageattn

    forward_only(mode)
    i, w = case.inputs, case.workload
    batch, seq = len(w.lengths), w.lengths[0]
    q, k, v = (x.view(batch, seq, *x.shape[1:]) for x in (i.q, i.k, i.v))
    return lambda: sageattn(q, k, v, tensor_layout="NHD", is_causal=w.causal)
