"""Grids over work: one program per (document, tile) that holds tokens, not per (tile of the
longest document, document).

A grid of cdiv(max_seqlen, B) x documents programs is mostly empty on skewed batches: on
skew8k+224x256 (one 8192-token document and 224 of 256) 1 program in 29 of the Q/K/V
quantizer had tokens, and its launch took twice eq8x8k's for the same 65,536 tokens
(torch.profiler, H200, 2026-11-29). ``tile_list`` builds, on the device and without a host
sync, the list of (document, tile) pairs that a launch of W programs reads; W, an upper
bound known on the host, is cdiv(T, B) + documents (a document of L tokens has
cdiv(L, B) <= L / B + 1 tiles). Entries past the real pairs hold document -1: their
programs return.
"""
import torch
import triton
import triton.language as tl


def list_extent(total: int, num_docs: int, block: int) -> int:
    """W, the number of programs of a launch over the tiles of ``block`` tokens of
    ``num_docs`` documents holding ``total`` tokens (every document counted once more, which
    also covers ``tile_list``'s one tile for an empty document)."""
    return triton.cdiv(total, block) + num_docs


def tile_list(cu_seqlens: torch.Tensor, total: int, block: int, *, reverse: bool,
              empty_docs: bool = False) -> torch.Tensor:
    """int32 [2, W] (``list_extent``): row 0 the document, row 1 the tile index within it, of
    each program. Documents go longest first (the longest tiles of a causal mask start
    first and short documents fill in behind them); within a document, tile indices ascend,
    or descend with ``reverse`` (query tiles under a causal mask: the last sees the most
    keys). empty_docs: give a document without tokens one tile (the quantizers zero a share
    of the transposed codes' tail in every document's tile 0). cu_seqlens: int32
    [num_docs + 1] with cu_seqlens[-1] = total."""
    num_docs = cu_seqlens.numel() - 1
    width = list_extent(total, num_docs, block)
    dev = cu_seqlens.device
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    tiles = torch.div(lengths + block - 1, block, rounding_mode="floor")  # [num_docs]
    if empty_docs:
        tiles = tiles.clamp(min=1)
    order = torch.argsort(lengths, descending=True, stable=True)  # [num_docs]
    ends = torch.cumsum(tiles[order], 0)  # [num_docs]: one past each sorted document's last program
    program = torch.arange(width, device=dev)
    rank = torch.searchsorted(ends, program, right=True)  # [W] the sorted document of each program
    real = rank < num_docs
    rank = rank.clamp(max=max(num_docs - 1, 0))
    doc = order[rank] if num_docs else torch.zeros_like(program)
    tile = program - (ends[rank] - tiles[doc]) if num_docs else program
    if reverse:
        tile = tiles[doc] - 1 - tile if num_docs else tile
    return torch.stack([torch.where(real, doc, -1), torch.where(real, tile, 0)]).to(torch.int32)


@triton.jit
def program_tile(p_work, width):
    """(document, tile index) of this program (program_id(0)) from a ``tile_list`` of
    ``width`` entries; document < 0: the program has no work."""
    pid = tl.program_id(0)
    return tl.load(p_work + pid), tl.load(p_work + width + pid)
