"""Per-row factors of the emulator (NUMERICS.md 3).

PV(i), the prefix max of V's token-block exponents over the keys query i may see, is what
lets the V fold stay causal: it depends only on blocks the row may see. Computed with torch
ops on the device of the inputs, without host synchronisation. The Triton route computes the
same values in one launch (``flamia.kernels.prefix``; a test checks they are equal).
"""
import torch

from .masks import last_visible_key
from .varlen import token_doc_positions

_SHIFT = 256  # exponents lie in [-100, 127]: a per-document offset of 256 keeps documents apart
_MAX_DOCS = 2**31 // _SHIFT - 1  # lifted exponents stay in int32


def prefix_v_exponent(ev: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                      total_q: int, causal: bool, window_size: tuple[int, int]) -> torch.Tensor:
    """ev: [total_k, H_kv] integer exponents of V. Returns PV: [total_q, H_kv] int32 (0 for
    rows that see no key)."""
    total_k = ev.shape[0]
    if cu_seqlens_k.numel() - 1 >= _MAX_DOCS:
        raise ValueError(f"cu_seqlens_k: at most {_MAX_DOCS - 1} documents, got {cu_seqlens_k.numel() - 1}")
    doc_k, _ = token_doc_positions(cu_seqlens_k, total_k)
    # A cumulative max over all packed keys that restarts at every document: lift each
    # document above the previous one, take cummax, and lower it back.
    # cummax runs along the contiguous last axis ([H, T]): along dim 0 of [T, H] it is slow
    # on the GPU. int32 (_MAX_DOCS): an int64 cummax is slower (docs/PERFORMANCE.md).
    lift = (doc_k.to(torch.int32) * _SHIFT + 128)[:, None]  # [total_k, 1]
    lifted = (ev.to(torch.int32) + lift).t().contiguous()  # [H_kv, total_k]
    prefix = torch.cummax(lifted, dim=1).values.t() - lift  # [total_k, H_kv]
    doc_q, pos_q = token_doc_positions(cu_seqlens_q, total_q)
    cu_q, cu_k = cu_seqlens_q.long(), cu_seqlens_k.long()
    len_q = cu_q[doc_q + 1] - cu_q[doc_q]
    len_k = cu_k[doc_q + 1] - cu_k[doc_q]
    last = last_visible_key(pos_q, len_q, len_k, causal, window_size)
    row = (cu_k[doc_q] + last.clamp(min=0)).clamp(max=max(total_k - 1, 0))
    pv = prefix[row] if total_k else torch.zeros((total_q, ev.shape[1]), dtype=torch.long, device=ev.device)
    return torch.where((last >= 0)[:, None], pv, torch.zeros_like(pv)).to(torch.int32)
