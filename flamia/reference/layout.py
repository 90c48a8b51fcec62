"""The emulator's working layout: documents padded to whole tiles, head-major.

Packed [total, H, D] rows become [B, H, L, D] with L a multiple of every tile size, so each
tile of the kernels is a slice of the padded axis (tiles start at document starts, as in
the kernels). K/V heads are expanded to the query heads (GQA); gradients are summed back.
"""
import math
from dataclasses import dataclass

import torch

from ..masks import visible
from ..varlen import Packing, make_packing, pad, unpad


@dataclass(frozen=True)
class DocLayout:
    """Padded geometry of one attention call. len_q, len_k: [B, 1, 1, 1] int64 per document
    (broadcast against [B, H, L, N] score tiles); pos_q/pos_k: [Lq]/[Lk] positions."""

    packing_q: Packing
    packing_k: Packing
    len_q: torch.Tensor
    len_k: torch.Tensor
    causal: bool
    window_size: tuple[int, int]
    group: int  # query heads per KV head

    @property
    def lq(self) -> int:
        """Lq: max_seqlen_q rounded up to the padding unit."""
        return self.packing_q.padded_len

    @property
    def lk(self) -> int:
        """Lk: max_seqlen_k rounded up to the padding unit."""
        return self.packing_k.padded_len

    def visible(self, q0: int, q1: int, k0: int, k1: int) -> torch.Tensor:
        """[B, 1, q1-q0, k1-k0] bool: which (query, key) pairs of the tile may attend."""
        dev = self.len_q.device
        qp = torch.arange(q0, q1, device=dev)[:, None]
        kp = torch.arange(k0, k1, device=dev)[None, :]
        return visible(qp, kp, self.len_q, self.len_k, self.causal, self.window_size)

    def rows_q(self, x: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """Packed per-query rows [Tq, H, ...] -> [B, H, Lq, ...]."""
        return pad(x, self.packing_q, fill).transpose(1, 2)

    def rows_k(self, x: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """Packed per-key rows [Tk, Hkv, ...] -> [B, Hq, Lk, ...] (KV heads expanded)."""
        return pad(x, self.packing_k, fill).transpose(1, 2).repeat_interleave(self.group, dim=1)

    def packed_q(self, y: torch.Tensor, total: int) -> torch.Tensor:
        """[B, H, Lq, ...] -> packed [Tq, H, ...]."""
        return unpad(y.transpose(1, 2), self.packing_q, total)

    def packed_k(self, y: torch.Tensor, total: int) -> torch.Tensor:
        """[B, Hq, Lk, ...] -> packed [Tk, Hkv, ...], summing the query heads of each group."""
        b, h, length = y.shape[:3]
        y = y.reshape(b, h // self.group, self.group, length, *y.shape[3:]).sum(2)
        return unpad(y.transpose(1, 2), self.packing_k, total)


def make_layout(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, window_size,
                heads_q: int, heads_k: int, multiple: int) -> DocLayout:
    """The layout of one call: cu_seqlens_q/k int32 [B + 1], max_seqlen_q/k host ints, each
    document padded to a multiple of ``multiple`` tokens; heads_q a multiple of heads_k."""
    pq = make_packing(cu_seqlens_q, max_seqlen_q, multiple)
    pk = make_packing(cu_seqlens_k, max_seqlen_k, multiple)
    shape = (-1, 1, 1, 1)
    return DocLayout(pq, pk, pq.lengths.reshape(shape), pk.lengths.reshape(shape), causal,
                     tuple(window_size), heads_q // heads_k)


def tile_multiple(*sizes: int) -> int:
    """The padding unit: a multiple of every tile extent and of the 32-token scale block."""
    return math.lcm(32, *sizes)
