"""Peers that ship with PyTorch: FlashAttention-2 varlen (the aten ops behind SDPA), SDPA on
nested (jagged) tensors, and FlexAttention with a document mask.

Each builder takes a ``Case`` and a mode and returns the timed job (``jobs.py``).
"""
import functools
import math

import torch
import torch.nn.functional as F

from ..varlen import token_doc_positions
from .jobs import autograd_job, staged_job
from .timing import Job
from .workloads import Case


def fa2_job(case: Case, mode: str) -> Job:
    """aten._flash_attention_forward / _flash_attention_backward on the packed rows,
    cu_seqlens int32, dropout 0. Both ops take the same positional arguments since torch
    2.4 (checked against the 2.13 schema)."""
    i, causal = case.inputs, case.workload.causal
    cu, n = i.cu_seqlens, i.max_seqlen
    scale = 1.0 / math.sqrt(case.workload.head_dim)

    def forward():
        return torch.ops.aten._flash_attention_forward(i.q, i.k, i.v, cu, cu, n, n, 0.0, causal, False,
                                                       scale=scale)

    def backward(state):
        out, lse, rng_state, unused, _ = state
        return torch.ops.aten._flash_attention_backward(i.do, i.q, i.k, i.v, out, lse, cu, cu, n, n, 0.0,
                                                        causal, rng_state, unused, scale=scale)

    return staged_job(forward, backward, mode)


def sdpa_nested_job(case: Case, mode: str) -> Job:
    """F.scaled_dot_product_attention on jagged nested tensors viewing the packed rows
    (PyTorch picks the kernel, FlashAttention-2 for bf16). min/max lengths are passed so
    that building the views reads nothing back from the GPU."""
    i = case.inputs
    offsets, lengths = i.cu_seqlens.long(), i.lengths

    def nested(x):  # [T, H, D] -> [B, H, j, D], a view of x
        return torch.nested.nested_tensor_from_jagged(
            x, offsets, min_seqlen=min(lengths), max_seqlen=max(lengths)).transpose(1, 2)

    def attention(q, k, v):
        out = F.scaled_dot_product_attention(nested(q), nested(k), nested(v), is_causal=case.workload.causal)
        return out.transpose(1, 2).values()

    return autograd_job(attention, i, mode)


def flex_job(case: Case, mode: str) -> Job:
    """torch.compile'd flex_attention on the row as one sequence [1, H, T, D] with a
    document mask (causal within the document when the workload is). The block mask is
    built here, outside the timed region."""
    i, w = case.inputs, case.workload
    attention = flex_document_attention(i.cu_seqlens, w.total, w.causal, w.gqa, w.name, with_lse=False)
    return autograd_job(lambda q, k, v: attention(q, k, v)[0], i, mode)


def flex_document_attention(cu_seqlens: torch.Tensor, total: int, causal: bool, gqa: bool, cache_key: str,
                            with_lse: bool):
    """The compiled flex_attention over packed rows [T, H, D] as one sequence [1, H, T, D]
    with a document mask (causal within the document when ``causal``), built here and
    kept. Returns attention(q, k, v) -> (out [T, Hq, D], lse [Hq, T] fp32, or None unless
    ``with_lse``); ``cache_key`` names the compiled function's shape (``_compiled_flex``)."""
    from torch.nn.attention.flex_attention import create_block_mask

    doc, _ = token_doc_positions(cu_seqlens, total)

    def same_document(b, h, q_idx, kv_idx):
        same = doc[q_idx] == doc[kv_idx]
        return same & (q_idx >= kv_idx) if causal else same

    # _compile builds the mask blockwise; eager evaluation would materialise T x T entries.
    block_mask = create_block_mask(same_document, None, None, total, total, device=cu_seqlens.device, _compile=True)
    compiled = _compiled_flex(cache_key)

    def attention(q, k, v):
        as_row = [x.transpose(0, 1).unsqueeze(0) for x in (q, k, v)]  # [1, H, T, D] views
        if not with_lse:
            return compiled(*as_row, block_mask=block_mask, enable_gqa=gqa).squeeze(0).transpose(0, 1), None
        out, lse = compiled(*as_row, block_mask=block_mask, enable_gqa=gqa, return_lse=True)
        return out.squeeze(0).transpose(0, 1), lse.squeeze(0)

    return attention


@functools.lru_cache(maxsize=1)
def _compiled_flex(cache_key: str):
    """torch.compile'd flex_attention for one shape at a time (a workload's modes, a peer's
    calls on one set of documents share it). A new key starts from a fresh dynamo cache, so
    its recompiles never reach dynamo's limit, past which it would silently fall back to the
    slow, memory-hungry eager flex_attention."""
    import torch._functorch.config as functorch_config
    from torch.nn.attention.flex_attention import flex_attention

    torch._dynamo.reset()
    # The bwd mode replays the backward of one saved forward (retain_graph=True), which a
    # compiled backward that donates its saved buffers refuses (torch 2.11: "compiled with
    # non-empty donated buffers"); donation only saves memory.
    functorch_config.donated_buffer = False
    return torch.compile(flex_attention, dynamic=False)
