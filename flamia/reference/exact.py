"""Exact varlen attention in FP32 or FP64 with plain torch ops: the accuracy yardstick.

Every document is attended separately on a padded per-document batch (``flamia.varlen``),
with the visibility rule of ``flamia.masks`` (causal and windows aligned bottom-right, as in
FlashAttention). Autograd supplies the backward. A query row that sees no key has output 0,
lse +inf and zero gradients, with no NaN in the forward or the backward.
"""
import math

import torch

from ..masks import visible
from ..varlen import Packing, make_packing, pad, unpad

EXACT_DTYPES = (torch.float32, torch.float64)


def document_mask(packing_q: Packing, packing_k: Packing, causal: bool,
                  window_size: tuple[int, int]) -> torch.Tensor:
    """Which padded key each padded query of the same document sees: bool [B, Lq, Lk]."""
    device = packing_q.index.device
    q_pos = torch.arange(packing_q.padded_len, device=device)[:, None]
    k_pos = torch.arange(packing_k.padded_len, device=device)[None, :]
    len_q = packing_q.lengths[:, None, None]
    len_k = packing_k.lengths[:, None, None]
    return visible(q_pos, k_pos, len_q, len_k, causal, window_size)


def masked_softmax(s: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax of scores s [..., M, N] over the keys where ``mask`` (broadcastable) holds.

    Returns (p [..., M, N], lse [..., M]); rows without a visible key get p = 0, lse = +inf.
    """
    row_ok = mask.any(-1, keepdim=True)
    # A row with no visible key would compute exp(-inf - (-inf)) = NaN in the forward and
    # in the backward; give it finite zeros instead and zero its probabilities afterwards.
    x = torch.where(mask, s, torch.where(row_ok, -math.inf, 0.0))
    lse = torch.logsumexp(x, dim=-1, keepdim=True)
    p = torch.where(mask, torch.exp(x - lse), 0.0)
    return p, torch.where(row_ok, lse, math.inf).squeeze(-1)


def exact_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                    max_seqlen_q: int, max_seqlen_k: int, causal: bool = False,
                    softmax_scale: float | None = None, window_size: tuple[int, int] = (-1, -1),
                    dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(scale * Q K^T + mask) V per document, computed in ``dtype``, differentiable.

    q: [Tq, Hq, D]; k, v: [Tk, Hkv, D], any float dtype, Hq a multiple of Hkv (query head h
    reads KV head h // (Hq // Hkv)). cu_seqlens_q/k: int [num_docs + 1] on the inputs'
    device. softmax_scale defaults to 1/sqrt(D); window_size = (left, right), -1 unbounded.
    Returns out [Tq, Hq, D] and lse [Hq, Tq] (natural log, +inf where a row sees no key),
    both in ``dtype`` (torch.float32 or torch.float64).
    """
    if dtype not in EXACT_DTYPES:
        raise ValueError(f"dtype: expected one of {EXACT_DTYPES}, got {dtype}")
    total_q, heads_q, head_dim = q.shape
    heads_kv = k.shape[1]
    if heads_q % heads_kv:
        raise ValueError(f"k: q's {heads_q} heads are not a multiple of k's {heads_kv} heads")
    scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else softmax_scale
    packing_q = make_packing(cu_seqlens_q, max_seqlen_q)
    packing_k = make_packing(cu_seqlens_k, max_seqlen_k)
    # Query heads grouped by the KV head they share, so GQA needs no copy of K and V.
    b_q = pad(q.to(dtype), packing_q).unflatten(2, (heads_kv, heads_q // heads_kv))  # [B, Lq, Hkv, G, D]
    b_k = pad(k.to(dtype), packing_k)  # [B, Lk, Hkv, D]
    b_v = pad(v.to(dtype), packing_k)  # [B, Lk, Hkv, D]
    b_s = torch.einsum("bihgd,bjhd->bhgij", b_q, b_k) * scale  # [B, Hkv, G, Lq, Lk]
    mask = document_mask(packing_q, packing_k, causal, window_size)[:, None, None]  # [B, 1, 1, Lq, Lk]
    b_p, b_lse = masked_softmax(b_s, mask)  # [B, Hkv, G, Lq, Lk], [B, Hkv, G, Lq]
    b_o = torch.einsum("bhgij,bjhd->bihgd", b_p, b_v).flatten(2, 3)  # [B, Lq, Hq, D]
    out = unpad(b_o, packing_q, total_q)
    lse = unpad(b_lse.flatten(1, 2).transpose(1, 2), packing_q, total_q).T  # [Hq, Tq]
    return out, lse
