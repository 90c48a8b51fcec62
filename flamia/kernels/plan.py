"""Everything a training call derives from cu_seqlens alone, in one launch: the transposed
codes' document starts (``layout.aligned_starts``) and the work list of every launch of the
forward and the backward (``worklist.tile_list``). Built as separate launches they were half
of an eager call's launches and their host time.

The lists share one int32 buffer, kept for the backward as a residual; ``PlanLayout`` (host
ints, computed once per shape) slices it. The launch reads nothing back to the host.
"""
import functools
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .configs import QUANTIZER, AttnTiles
from .launch import launch
from .layout import _CHUNK, DOC_ALIGN, write_aligned_starts
from .worklist import _DOCS, _FILL, list_extent, write_tile_list


@dataclass(frozen=True)
class PlanLayout:
    """The work lists of one call shape: ``names`` in buffer order, each ``widths[i]``
    entries ([2, W] int32, ``tile_list``) at ``sizes[i] = 2 W`` words of the buffer;
    ``width``: the widths by name."""

    names: tuple
    widths: tuple
    sizes: tuple
    width: dict = field(compare=False)

    @property
    def words(self) -> int:
        return sum(self.sizes)

    def views(self, buffer: torch.Tensor) -> dict:
        """The lists as [2, W] views of ``buffer``, by name."""
        return {name: part.view(2, w) for name, w, part in zip(self.names, self.widths, buffer.split(self.sizes))}


@functools.lru_cache(maxsize=1024)
def plan_layout(total_q: int, total_k: int, num_docs: int, tiles: AttnTiles) -> PlanLayout:
    """The lists: the Q and K quantizers' units, the forward's query tiles, the dO
    quantizer's query steps, the dK/dV kernel's key tiles and the dQ kernel's query tiles.
    The layout does not depend on whether both sides share cu_seqlens (then K's list is left
    unwritten, Q's serving both), so the backward finds the same one under torch.compile,
    where the two may arrive as distinct tensors."""
    unit = QUANTIZER.operand_unit
    lists = [("q_operand", total_q, unit), ("k_operand", total_k, unit)]
    lists += [("fwd", total_q, tiles.fwd_block_m), ("grad_out", total_q, tiles.bwd_block_m),
              ("dkdv", total_k, tiles.bwd_block_n), ("dq", total_q, tiles.dq_block_m)]
    widths = tuple(list_extent(total, num_docs, block) for _, total, block in lists)
    names = tuple(name for name, _, _ in lists)
    return PlanLayout(names, widths, tuple(2 * w for w in widths), dict(zip(names, widths)))


class Plan(NamedTuple):
    """cu_qt, cu_kt: int32 [num_docs + 1] (``aligned_starts``; the same tensor when both sides
    share cu_seqlens); buffer: the lists' int32 words; lists: their [2, W] views by name,
    "k_operand" being Q's list when both sides share cu_seqlens."""

    cu_qt: torch.Tensor
    cu_kt: torch.Tensor
    buffer: torch.Tensor
    lists: dict


@triton.jit
def _plan_kernel(p_cu_q, p_cu_k, p_cu_qt, p_cu_kt, p_qop, p_kop, p_fwd, p_go, p_dkdv, p_dq, num_docs,
                 w_qop, w_kop, w_fwd, w_go, w_dkdv, w_dq, UNIT: tl.constexpr, FWD_M: tl.constexpr,
                 GO_M: tl.constexpr, DKDV_N: tl.constexpr, DQ_M: tl.constexpr, SHARED: tl.constexpr,
                 DOC_ALIGN: tl.constexpr, CHUNK: tl.constexpr, DOCS: tl.constexpr, FILL: tl.constexpr):
    """Program d of num_docs + 1: its share of every list (``write_tile_list``); the last
    one also writes the document starts."""
    d = tl.program_id(0)
    write_tile_list(p_cu_q, p_qop, num_docs, w_qop, d, UNIT, False, True, DOCS, FILL)
    if not SHARED:
        write_tile_list(p_cu_k, p_kop, num_docs, w_kop, d, UNIT, False, True, DOCS, FILL)
    write_tile_list(p_cu_q, p_fwd, num_docs, w_fwd, d, FWD_M, True, False, DOCS, FILL)
    write_tile_list(p_cu_q, p_go, num_docs, w_go, d, GO_M, False, True, DOCS, FILL)
    write_tile_list(p_cu_k, p_dkdv, num_docs, w_dkdv, d, DKDV_N, False, False, DOCS, FILL)
    write_tile_list(p_cu_q, p_dq, num_docs, w_dq, d, DQ_M, True, False, DOCS, FILL)
    if d == num_docs:
        write_aligned_starts(p_cu_q, p_cu_qt, num_docs, DOC_ALIGN, CHUNK)
        if not SHARED:
            write_aligned_starts(p_cu_k, p_cu_kt, num_docs, DOC_ALIGN, CHUNK)


def build_plan(cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, total_q: int, total_k: int,
               tiles: AttnTiles) -> Plan:
    """The call's ``Plan`` in one launch; both sides share cu_seqlens when they are one tensor."""
    shared = cu_seqlens_k is cu_seqlens_q
    num_docs = cu_seqlens_q.numel() - 1
    layout = plan_layout(total_q, total_k, num_docs, tiles)
    cu_qt = torch.empty_like(cu_seqlens_q)
    cu_kt = cu_qt if shared else torch.empty_like(cu_seqlens_k)
    buffer = torch.empty(layout.words, dtype=torch.int32, device=cu_seqlens_q.device)
    lists = layout.views(buffer)
    w = layout.width
    launch(_plan_kernel, (num_docs + 1,), cu_seqlens_q, cu_seqlens_k, cu_qt, cu_kt, lists["q_operand"],
           lists["k_operand"], lists["fwd"], lists["grad_out"], lists["dkdv"], lists["dq"], num_docs,
           w["q_operand"], w["k_operand"], w["fwd"], w["grad_out"], w["dkdv"], w["dq"], UNIT=QUANTIZER.operand_unit, FWD_M=tiles.fwd_block_m,
           GO_M=tiles.bwd_block_m, DKDV_N=tiles.bwd_block_n, DQ_M=tiles.dq_block_m, SHARED=shared,
           DOC_ALIGN=DOC_ALIGN, CHUNK=_CHUNK, DOCS=_DOCS, FILL=_FILL)
    if shared:
        lists["k_operand"] = lists["q_operand"]
    return Plan(cu_qt, cu_kt, buffer, lists)
