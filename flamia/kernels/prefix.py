"""PV on the GPU in one launch: ``flamia.scaling.prefix_v_exponent``'s twin for the Triton route.

PV(i), the largest V exponent over the keys 0..last(i) of query i's document (NUMERICS.md 3),
is a prefix maximum. The torch version (the emulator's) lifts documents apart and runs a
cummax over every key: about 20 small launches, whose host time an eager training call would
pay. Here V's exponents are constant over
each document-local block of ``block`` keys (the quantizer writes one per block), so the
prefix over keys is a maximum over block starts: each program takes ROWS packed query rows,
finds their documents by binary search over cu_seqlens_q, and sweeps the block starts that
its rows see. The result equals the torch version bit for bit (integers; tests check it).
"""
import torch
import triton
import triton.language as tl

from ..masks import effective_window
from .launch import PACKING_INTS, cdiv, launch

_ROWS = 64  # query rows per program
_BLOCKS = 64  # block starts per step of the sweep
_NONE = -1024  # below every int8 exponent


@triton.jit
def _find_docs(p_cu, rows, num_docs, steps):
    """Document of each packed row [N] (cu_seqlens[doc] <= row < cu_seqlens[doc + 1]; empty
    documents are skipped), by binary search in steps >= log2(num_docs + 1) steps (a runtime
    count: it follows the packing, which must not compile a new kernel)."""
    lo = tl.zeros_like(rows)  # invariant: cu[lo] <= row
    hi = tl.zeros_like(rows) + num_docs  # invariant: row < cu[hi]
    for _ in range(steps):
        go = hi - lo > 1
        mid = (lo + hi) // 2
        below = tl.load(p_cu + mid, mask=go, other=0) <= rows
        lo = tl.where(go & below, mid, lo)
        hi = tl.where(go & ~below, mid, hi)
    return lo


@triton.jit(do_not_specialize=PACKING_INTS)
def _prefix_v_kernel(p_ev, p_pv, p_cu_q, p_cu_k, total_q, num_docs, steps, heads_kv, wr,
                     BLOCK: tl.constexpr, ROWS: tl.constexpr, BLOCKS: tl.constexpr, NONE: tl.constexpr):
    """Program (row chunk, KV head): PV of ROWS packed query rows. wr: the right window bound
    with causal folded in (-1: unbounded)."""
    h = tl.program_id(1).to(tl.int64)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # [ROWS] packed query rows
    m_r = rows < total_q
    doc = _find_docs(p_cu_q, rows, num_docs, steps)  # [ROWS]
    q_start = tl.load(p_cu_q + doc, mask=m_r, other=0)
    len_q = tl.load(p_cu_q + doc + 1, mask=m_r, other=0) - q_start
    k_start = tl.load(p_cu_k + doc, mask=m_r, other=0)
    len_k = tl.load(p_cu_k + doc + 1, mask=m_r, other=0) - k_start
    # masks.last_visible_key: the last key each row may see (< 0: none).
    last = len_k - 1
    last = tl.where(wr >= 0, tl.minimum(last, rows - q_start + (len_k - len_q) + wr), last)  # [ROWS]
    last = tl.where(m_r, last, -1)
    blocks = tl.where(last >= 0, last // BLOCK + 1, 0)  # [ROWS] block starts each row sees
    pv = tl.full([ROWS], NONE, tl.int32)
    for b0 in range(0, tl.max(blocks, axis=0), BLOCKS):
        b = b0 + tl.arange(0, BLOCKS)  # [BLOCKS] block indices in the document
        seen = b[None, :] < blocks[:, None]  # [ROWS, BLOCKS]
        o_k = (k_start[:, None] + b[None, :] * BLOCK).to(tl.int64)  # [ROWS, BLOCKS] first key of each block
        e = tl.load(p_ev + o_k * heads_kv + h, mask=seen, other=0).to(tl.int32)  # int8: NONE would wrap
        pv = tl.maximum(pv, tl.max(tl.where(seen, e, NONE), axis=1))
    pv = tl.where(last >= 0, pv, 0)
    tl.store(p_pv + rows.to(tl.int64) * heads_kv + h, pv, mask=m_r)


def prefix_v_exponent(ev: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, total_q: int,
                      causal: bool, window_size: tuple[int, int], block: int) -> torch.Tensor:
    """ev: [total_k, H_kv] int8 exponents of V, constant over each document-local block of
    ``block`` keys (as ``quantize_operand`` writes them); cu_seqlens_q/k: int32 [num_docs + 1].
    Returns PV: [total_q, H_kv] int32 (0 for rows that see no key), as
    ``flamia.scaling.prefix_v_exponent``; nothing is read back to the host."""
    if ev.dtype != torch.int8 or ev.dim() != 2:
        raise ValueError(f"ev: expected int8 [total_k, H_kv] exponents, got {ev.dtype} {tuple(ev.shape)}")
    heads_kv = ev.shape[1]
    num_docs = cu_seqlens_q.numel() - 1
    pv = torch.empty((total_q, heads_kv), dtype=torch.int32, device=ev.device)
    if total_q == 0 or heads_kv == 0:
        return pv
    if ev.shape[0] == 0:  # no keys at all: no row sees one
        return pv.zero_()
    _, wr = effective_window(causal, window_size)
    grid = (cdiv(total_q, _ROWS), heads_kv)
    launch(_prefix_v_kernel, grid, ev, pv, cu_seqlens_q, cu_seqlens_k, total_q, num_docs, max(num_docs, 1).bit_length(),
           heads_kv, wr, BLOCK=block, ROWS=_ROWS, BLOCKS=_BLOCKS, NONE=_NONE)
    return pv
