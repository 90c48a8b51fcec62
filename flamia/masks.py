"""Which keys a query may see, on packed documents (NUMERICS.md 3).

Causal masks and windows are aligned bottom-right as in FlashAttention: with ``off = Lk - Lq``
query i sees key k iff ``0 <= k < Lk``, ``k <= i + off + wr`` and ``k >= i + off - wl``, where
``(wl, wr) = window_size`` (-1 = unbounded) and ``causal`` forces ``wr = 0``.
"""
import torch


def effective_window(causal: bool, window_size: tuple[int, int]) -> tuple[int, int]:
    """(wl, wr) with causal folded in; -1 means unbounded."""
    wl, wr = window_size
    return wl, (0 if causal else wr)


def visible(q_pos: torch.Tensor, k_pos: torch.Tensor, len_q: torch.Tensor, len_k: torch.Tensor,
            causal: bool, window_size: tuple[int, int]) -> torch.Tensor:
    """Boolean mask, broadcast of q_pos [..., M, 1] against k_pos [..., 1, N]; len_q, len_k
    broadcastable per document (e.g. [B, 1, 1]). Positions are within the document."""
    wl, wr = effective_window(causal, window_size)
    off = len_k - len_q
    ok = (k_pos < len_k) & (q_pos < len_q) & (k_pos >= 0)
    if wr >= 0:
        ok = ok & (k_pos <= q_pos + off + wr)
    if wl >= 0:
        ok = ok & (k_pos >= q_pos + off - wl)
    return ok


def last_visible_key(q_pos: torch.Tensor, len_q: torch.Tensor, len_k: torch.Tensor,
                     causal: bool, window_size: tuple[int, int]) -> torch.Tensor:
    """Largest key position query q_pos may see, clipped to len_k - 1 (may be < 0: none)."""
    _, wr = effective_window(causal, window_size)
    last = len_k - 1 + torch.zeros_like(q_pos)
    if wr >= 0:
        last = torch.minimum(last, q_pos + (len_k - len_q) + wr)
    return last
