"""Everything a training call derives from cu_seqlens alone, in one launch: the transposed
codes' document starts (``layout.aligned_starts``) and the work list of every launch of the
forward and the backward (``worklist.tile_list``). Built as separate launches they were half
of an eager call's launches and their host time.

The lists share one int32 buffer, kept for the backward as a residual; ``PlanLayout`` (host
ints, computed once per shape) slices it. The launch reads nothing back to the host.
"""
import functools
from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .configs import QUANTIZER, AttnTiles
from .launch import PACKING_INTS, launch
from .layout import _CHUNK, DOC_ALIGN, write_aligned_starts
from .worklist import _DOCS, _FILL, list_extent, write_tile_list


_LIST_ALIGN = 4  # int32 words


@dataclass(frozen=True)
class PlanLayout:
    """The work lists of one call shape in one int32 buffer of ``words`` words: list
    ``name`` ([2, W] int32, ``tile_list``) has ``width[name]`` entries from word
    ``offset[name]``."""

    width: dict
    offset: dict
    words: int

    def view(self, buffer: torch.Tensor, name: str) -> torch.Tensor:
        """List ``name`` as a [2, W] view of ``buffer``."""
        w, o = self.width[name], self.offset[name]
        return buffer[o:o + 2 * w].view(2, w)


@functools.lru_cache(maxsize=1024)
def plan_layout(total_q: int, total_k: int, num_docs: int, tiles: AttnTiles) -> PlanLayout:
    """The lists: the Q and K quantizers' units, the forward's query tiles, the dO
    quantizer's query steps, the dK/dV kernel's key tiles and the dQ kernel's query tiles.
    The layout does not depend on whether both sides share cu_seqlens (then K's list is left
    unwritten, Q's serving both), so the backward finds the same one under torch.compile,
    where the two may arrive as distinct tensors."""
    unit = QUANTIZER.operand_unit
    lists = [("q_operand", total_q, unit), ("k_operand", total_k, unit), ("fwd", total_q, tiles.fwd_block_m),
             ("grad_out", total_q, tiles.bwd_block_m), ("dkdv", total_k, tiles.bwd_block_n),
             ("dq", total_q, tiles.dq_block_m)]
    width, offset, words = {}, {}, 0
    for name, total, block in lists:
        width[name], offset[name] = list_extent(total, num_docs, block), words
        # every list starts 16-byte aligned, as kernels are specialized on their pointers' alignment
        words += -(-2 * width[name] // _LIST_ALIGN) * _LIST_ALIGN
    return PlanLayout(width, offset, words)


class Plan(NamedTuple):
    """cu_qt, cu_kt: int32 [num_docs + 1] (``aligned_starts``; the same tensor when both sides
    share cu_seqlens); buffer: the lists' int32 words in ``layout``; shared: both sides share
    cu_seqlens."""

    cu_qt: torch.Tensor
    cu_kt: torch.Tensor
    buffer: torch.Tensor
    layout: PlanLayout
    shared: bool

    def work(self, name: str) -> torch.Tensor:
        """The [2, W] list ``name``; K's quantizer list is Q's when both sides share cu_seqlens."""
        return self.layout.view(self.buffer, "q_operand" if self.shared and name == "k_operand" else name)


@triton.jit
def _at(p, offset):
    return p + offset.to(tl.int64)


@triton.jit(do_not_specialize=PACKING_INTS)
def _plan_kernel(p_cu_q, p_cu_k, p_cu_qt, p_cu_kt, p_lists, num_docs, o_qop, o_kop, o_fwd, o_go, o_dkdv, o_dq,
                 w_qop, w_kop, w_fwd, w_go, w_dkdv, w_dq, UNIT: tl.constexpr, FWD_M: tl.constexpr,
                 GO_M: tl.constexpr, DKDV_N: tl.constexpr, DQ_M: tl.constexpr, SHARED: tl.constexpr,
                 DOC_ALIGN: tl.constexpr, CHUNK: tl.constexpr, DOCS: tl.constexpr, FILL: tl.constexpr):
    """Program d of num_docs + 1: its share of every list (``write_tile_list``; list x at
    word o_x of p_lists, w_x entries); the last one also writes the document starts."""
    d = tl.program_id(0)
    write_tile_list(p_cu_q, _at(p_lists, o_qop), num_docs, w_qop, d, UNIT, False, True, DOCS, FILL)
    if not SHARED:
        write_tile_list(p_cu_k, _at(p_lists, o_kop), num_docs, w_kop, d, UNIT, False, True, DOCS, FILL)
    write_tile_list(p_cu_q, _at(p_lists, o_fwd), num_docs, w_fwd, d, FWD_M, True, False, DOCS, FILL)
    write_tile_list(p_cu_q, _at(p_lists, o_go), num_docs, w_go, d, GO_M, False, True, DOCS, FILL)
    write_tile_list(p_cu_k, _at(p_lists, o_dkdv), num_docs, w_dkdv, d, DKDV_N, False, False, DOCS, FILL)
    write_tile_list(p_cu_q, _at(p_lists, o_dq), num_docs, w_dq, d, DQ_M, True, False, DOCS, FILL)
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
    o, w = layout.offset, layout.width
    launch(_plan_kernel, (num_docs + 1,), cu_seqlens_q, cu_seqlens_k, cu_qt, cu_kt, buffer, num_docs,
           o["q_operand"], o["k_operand"], o["fwd"], o["grad_out"], o["dkdv"], o["dq"],
           w["q_operand"], w["k_operand"], w["fwd"], w["grad_out"], w["dkdv"], w["dq"], UNIT=QUANTIZER.operand_unit,
           FWD_M=tiles.fwd_block_m, GO_M=tiles.bwd_block_m, DKDV_N=tiles.bwd_block_n, DQ_M=tiles.dq_block_m,
           SHARED=shared, DOC_ALIGN=DOC_ALIGN, CHUNK=_CHUNK, DOCS=_DOCS, FILL=_FILL)
    return Plan(cu_qt, cu_kt, buffer, layout, shared)
