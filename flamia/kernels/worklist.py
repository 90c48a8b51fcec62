"""Grids over work: one program per (document, tile) that holds tokens, not per (tile of the
longest document, document).

A grid of cdiv(max_seqlen, B) x documents programs is mostly empty on skewed batches: on
skew8k+224x256 (one 8192-token document and 224 of 256) 1 program in 29 of the Q/K/V
quantizer would hold tokens. ``tile_list`` builds, on the device and without a host
sync, the list of (document, tile) pairs that a launch of W programs reads; W, an upper
bound known on the host, is cdiv(T, B) + documents (a document of L tokens has
cdiv(L, B) <= L / B + 1 tiles). Entries past the real pairs hold document -1: their
programs return.

The list is one launch of ``_tile_list_kernel``: built from torch ops (argsort, cumsum,
searchsorted, gathers) it would cost about as much GPU time as the grids save on small
batches.
"""
import torch
import triton
import triton.language as tl

from .launch import PACKING_INTS, cdiv, launch

_DOCS = 1024  # documents compared per step when a document counts the tiles ranked before it
_FILL = 1024  # list entries written per step


def list_extent(total: int, num_docs: int, block: int) -> int:
    """W, the number of programs of a launch over the tiles of ``block`` tokens of
    ``num_docs`` documents holding ``total`` tokens (every document counted once more, which
    also covers ``tile_list``'s one tile for an empty document)."""
    return cdiv(total, block) + num_docs


def tile_list(cu_seqlens: torch.Tensor, total: int, block: int, *, reverse: bool,
              empty_docs: bool = False) -> torch.Tensor:
    """int32 [2, W] (``list_extent``): row 0 the document, row 1 the tile index within it, of
    each program. Documents go longest first (the longest tiles of a causal mask start
    first and short documents fill in behind them; equal lengths keep their order); within a
    document, tile indices ascend, or descend with ``reverse`` (query tiles under a causal
    mask: the last sees the most keys). empty_docs: give a document without tokens one tile
    (the quantizers zero a share of the transposed codes' tail in every document's tile 0).
    cu_seqlens: int32 [num_docs + 1] with cu_seqlens[-1] = total."""
    num_docs = cu_seqlens.numel() - 1
    width = list_extent(total, num_docs, block)
    work = torch.empty((2, width), dtype=torch.int32, device=cu_seqlens.device)
    # Programs 0..num_docs-1 write their document's tiles; program num_docs the padding.
    launch(_tile_list_kernel, (num_docs + 1,), cu_seqlens, work, num_docs, width, BLOCK=block,
                                       REVERSE=reverse, EMPTY_DOCS=empty_docs,
                                       DOCS=_DOCS, FILL=_FILL)
    return work


@triton.jit
def _doc_tiles(p_cu, doc, mask, BLOCK: tl.constexpr, EMPTY_DOCS: tl.constexpr):
    """(length, tiles) int32 of documents ``doc`` (any shape; 0 where ~mask)."""
    length = tl.load(p_cu + doc + 1, mask=mask, other=0) - tl.load(p_cu + doc, mask=mask, other=0)
    tiles = tl.cdiv(length, BLOCK)
    if EMPTY_DOCS:
        tiles = tl.where(mask, tl.maximum(tiles, 1), 0)
    return length, tiles


@triton.jit(do_not_specialize=PACKING_INTS)
def _tile_list_kernel(p_cu, p_work, num_docs, width, BLOCK: tl.constexpr, REVERSE: tl.constexpr,
                      EMPTY_DOCS: tl.constexpr, DOCS: tl.constexpr, FILL: tl.constexpr):
    write_tile_list(p_cu, p_work, num_docs, width, tl.program_id(0), BLOCK, REVERSE, EMPTY_DOCS, DOCS, FILL)


@triton.jit
def write_tile_list(p_cu, p_work, num_docs, width, d, BLOCK: tl.constexpr, REVERSE: tl.constexpr,
                    EMPTY_DOCS: tl.constexpr, DOCS: tl.constexpr, FILL: tl.constexpr):
    """Program d's share of a ``tile_list`` (one launch of num_docs + 1 programs writes it):
    d < num_docs: document d's first entry is the number of tiles of the documents ranked
    before it (longer, or as long and earlier), found by one pass over all documents; it then
    writes its tiles. d = num_docs: (-1, 0) from the last real entry to W."""
    is_doc = d < num_docs
    own_len, own_tiles = _doc_tiles(p_cu, d, is_doc, BLOCK, EMPTY_DOCS)
    start = 0
    for j0 in range(0, num_docs, DOCS):
        j = j0 + tl.arange(0, DOCS)  # [DOCS]
        valid = j < num_docs
        length, tiles = _doc_tiles(p_cu, j, valid, BLOCK, EMPTY_DOCS)
        before = valid & ((length > own_len) | ((length == own_len) & (j < d)) | ~is_doc)
        start += tl.sum(tl.where(before, tiles, 0), axis=0)
    # A document's entries run over [start, start + own_tiles); the padding over [start, width).
    stop = tl.where(is_doc, start + own_tiles, width)
    for p0 in range(start, stop, FILL):
        p = p0 + tl.arange(0, FILL)  # [FILL] list positions
        inside = p < stop
        t = p - start  # [FILL] tile index in document order
        if REVERSE:
            t = own_tiles - 1 - t
        tl.store(p_work + p, tl.where(is_doc, d, -1), mask=inside)
        tl.store(p_work + width + p, tl.where(is_doc, t, 0), mask=inside)


@triton.jit
def program_tile(p_work, width):
    """(document, tile index) of this program (program_id(0)) from a ``tile_list`` of
    ``width`` entries; document < 0: the program has no work."""
    pid = tl.program_id(0)
    return tl.load(p_work + pid), tl.load(p_work + width + pid)


@triton.jit
def program_tile_within(p_work, width):
    """``program_tile`` for a launch whose grid may run past this list's ``width`` entries (a
    launch over two lists, ``quantize.quantize_pair``): those programs have no work."""
    pid = tl.program_id(0)
    inside = pid < width
    return tl.load(p_work + pid, mask=inside, other=-1), tl.load(p_work + width + pid, mask=inside, other=0)
