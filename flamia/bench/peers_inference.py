"""Forward-only peers: FlashInfer prefill on ragged K/V (BF16, and FP8 with per-tensor
scales) and SageAttention 1 (INT8 Q/K, batched API, so equal-length documents only).

FlashInfer's plan() runs here, outside the timed region; run() is the timed call. FP8 Q, K
and V are quantized inside the call (``fp8.quantize_per_tensor``) and their descales are
passed per head, the layout the FA3 backend reads; the output is bf16.
"""
import torch

from .fp8 import FP8, quantize_per_tensor
from .jobs import forward_only
from .timing import Job
from .workloads import Case

FLASHINFER_WORKSPACE_BYTES = 256 << 20


def flashinfer_job(case: Case, mode: str, fp8: bool) -> Job:
    """BatchPrefillWithRaggedKVCacheWrapper, NHD layout; backend "fa3" for FP8 (the Hopper
    FP8 path), "auto" for BF16."""
    import flashinfer

    forward_only(mode)
    i, w = case.inputs, case.workload
    workspace = torch.zeros(FLASHINFER_WORKSPACE_BYTES, dtype=torch.uint8, device=i.q.device)
    wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD", backend="fa3" if fp8 else "auto")
    data_type = FP8 if fp8 else i.q.dtype
    wrapper.plan(i.cu_seqlens, i.cu_seqlens, w.heads_q, w.heads_kv, w.head_dim, causal=w.causal,
                 q_data_type=data_type, kv_data_type=data_type, o_data_type=i.q.dtype)
    if not fp8:
        return lambda: wrapper.run(i.q, i.k, i.v)

    def run_fp8():
        quantized = [quantize_per_tensor(x) for x in (i.q, i.k, i.v)]
        codes = [x for x, _ in quantized]
        descales = [d.reshape(1).expand(x.shape[1]).contiguous() for x, d in quantized]  # [heads] fp32
        return wrapper.run(*codes, *descales)

    return run_fp8


def sage1_job(case: Case, mode: str) -> Job:
    """sageattention.sageattn on [B, S, H, D] views of the packed rows ("NHD" layout)."""
    from sageattention import sageattn

    forward_only(mode)
    i, w = case.inputs, case.workload
    batch, seq = len(w.lengths), w.lengths[0]
    q, k, v = (x.view(batch, seq, *x.shape[1:]) for x in (i.q, i.k, i.v))
    return lambda: sageattn(q, k, v, tensor_layout="NHD", is_causal=w.causal)
