"""Packed-document bookkeeping: from ``cu_seqlens`` to a padded per-document view and back.

Everything here is computed on the device of ``cu_seqlens`` with no host synchronisation;
the only host integers are the number of documents (a shape) and ``max_seqlen``.
"""
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Packing:
    """A padded view of packed rows. ``index[b, i]`` is the packed row of position i of
    document b (clamped to a valid row where i >= length), ``valid[b, i]`` says whether it
    exists. Shapes: [num_docs, padded_len]; ``lengths``: [num_docs] int64."""

    index: torch.Tensor
    valid: torch.Tensor
    lengths: torch.Tensor

    @property
    def padded_len(self) -> int:
        return self.index.shape[1]


def make_packing(cu_seqlens: torch.Tensor, max_seqlen: int, multiple: int = 1) -> Packing:
    """Padded view with the padded length rounded up to ``multiple`` (tile or block size)."""
    cu = cu_seqlens.long()
    padded = max(multiple, -(-max(int(max_seqlen), 1) // multiple) * multiple)
    starts, lengths = cu[:-1], cu[1:] - cu[:-1]
    pos = torch.arange(padded, device=cu.device)
    valid = pos[None, :] < lengths[:, None]
    index = torch.minimum(starts[:, None] + pos[None, :], (cu[-1] - 1).clamp(min=0))
    return Packing(index=index, valid=valid, lengths=lengths)


def pad(x: torch.Tensor, packing: Packing, fill: float = 0.0) -> torch.Tensor:
    """[total, ...] -> [num_docs, padded_len, ...], ``fill`` where invalid."""
    y = x[packing.index]
    mask = packing.valid.reshape(*packing.valid.shape, *([1] * (x.dim() - 1)))
    return torch.where(mask, y, torch.full((), fill, dtype=y.dtype, device=y.device))


def unpad(y: torch.Tensor, packing: Packing, total: int) -> torch.Tensor:
    """[num_docs, padded_len, ...] -> [total, ...] (rows not covered stay zero)."""
    out = torch.zeros((total, *y.shape[2:]), dtype=y.dtype, device=y.device)
    idx = torch.where(packing.valid, packing.index, torch.full_like(packing.index, total))
    out = torch.cat((out, out.new_zeros((1, *y.shape[2:]))))
    out.index_copy_(0, idx.flatten(), y.reshape(-1, *y.shape[2:]))
    return out[:total]


def token_doc_positions(cu_seqlens: torch.Tensor, total: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(document index, position in its document) of every packed row, int64 [total]."""
    cu = cu_seqlens.long()
    rows = torch.arange(total, device=cu.device)
    doc = torch.searchsorted(cu[1:], rows, right=True)
    return doc, rows - cu[doc]
