"""The token axis of the transposed FP8 codes (Q^T, K^T, V^T, dOt^T: [H, D, T_t], tokens
contiguous), which Hopper's FP8 MMA needs as K-major operands of products over tokens.

Document b's tokens fill columns ``cu_t[b]`` onwards, ``cu_t = [0, cumsum(round_up(len_b,
DOC_ALIGN))]``: every document starts at a multiple of DOC_ALIGN tokens, a multiple of every
kernel step over transposed tokens (the forward's key tile, the dK/dV query step, the dQ key
step), so a tile of one document never reads another document's codes: a masked zero times
a neighbour's NaN would be NaN, and a non-finite value must stay in its document. Tiles
start 16-byte aligned and load as wide vectors (with packed starts, which are
generally not aligned, Triton falls back to single-byte loads), and a quantizer's 32-token
unit writes each head-dim row of its columns as one whole 32-byte sector (at T_ALIGN = 16
half the documents of a packed batch would split that row over two sectors). Columns
between documents and past the last one hold zero codes (the quantizers write them: tokens
up to the next multiple of T_ALIGN with their unit, the rest in ``zero_padding``): kernels
load whole aligned tiles, and uninitialised FP8 bytes may be NaNs.

Within each 16-column group the tokens sit in the order of the FP8 wgmma's register A
operand (``mma_token_order``): every product over tokens takes its other operand (P^, G,
their transposes) from an accumulator in registers, and in that order each thread already
holds the A operand's values, so the conversion needs no shuffles (FlashAttention-3 permutes
V for its FP8 forward the same way). Token ``16 g + 8 j + 2 t + e`` of a document sits at
column ``cu_t[b] + 16 g + 4 t + 2 j + e`` (``token_columns``).

Everything here runs on the device, without a host sync; the launchers' shape check and the
quantizers' column math (``unit_columns``, ``zero_padding``) live here too.
"""
import torch
import triton
import triton.language as tl

from .launch import PACKING_INTS, launch

T_ALIGN = 32  # tokens (= bytes of E4M3 codes): one 32-byte sector per row of a 32-token unit
DOC_ALIGN = 128  # tokens: where documents start, a multiple of every kernel's step over tokens
_DOC_ALIGN = tl.constexpr(DOC_ALIGN)
_CHUNK = 1024  # documents per step of aligned_starts


def check_operand(name: str, x: torch.Tensor, dtype: torch.dtype, shape: tuple) -> None:
    """The launchers' argument check: a contiguous ``dtype`` tensor of exactly ``shape``."""
    if x.dtype != dtype:
        raise ValueError(f"{name}: dtype must be {dtype}, got {x.dtype}")
    if tuple(x.shape) != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {tuple(x.shape)}")
    if not x.is_contiguous():
        raise ValueError(f"{name}: must be contiguous")


def aligned_starts(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """cu_t, int32 [num_docs + 1]: each document's first column in the transposed codes, from
    cu_seqlens int32 [num_docs + 1] (packed row starts), on its device. One launch instead of
    ``aligned_starts_reference``'s seven torch ops, for the host time of an eager call."""
    starts = torch.empty_like(cu_seqlens)
    launch(_aligned_starts_kernel, (1,), cu_seqlens, starts, cu_seqlens.numel() - 1, DOC_ALIGN=DOC_ALIGN, CHUNK=_CHUNK)
    return starts


def aligned_starts_reference(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """``aligned_starts`` in torch ops (the tests' reference and ``transposed_reference``'s)."""
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    spans = (lengths + (DOC_ALIGN - 1)) // DOC_ALIGN * DOC_ALIGN
    starts = torch.zeros_like(cu_seqlens)
    starts[1:] = torch.cumsum(spans, 0, dtype=cu_seqlens.dtype)
    return starts


@triton.jit(do_not_specialize=PACKING_INTS)
def _aligned_starts_kernel(p_cu, p_starts, num_docs, DOC_ALIGN: tl.constexpr, CHUNK: tl.constexpr):
    write_aligned_starts(p_cu, p_starts, num_docs, DOC_ALIGN, CHUNK)


@triton.jit
def write_aligned_starts(p_cu, p_starts, num_docs, DOC_ALIGN: tl.constexpr, CHUNK: tl.constexpr):
    """``aligned_starts`` in one program: a running sum of the documents' lengths rounded up
    to DOC_ALIGN, CHUNK documents per step."""
    tl.store(p_starts, 0)
    carry = 0
    for d0 in range(0, num_docs, CHUNK):
        d = d0 + tl.arange(0, CHUNK)  # [CHUNK] documents
        m_d = d < num_docs
        length = tl.load(p_cu + d + 1, mask=m_d, other=0) - tl.load(p_cu + d, mask=m_d, other=0)
        spans = tl.cdiv(length, DOC_ALIGN) * DOC_ALIGN
        ends = carry + tl.cumsum(spans, axis=0)  # [CHUNK] each document's end column
        tl.store(p_starts + d + 1, ends, mask=m_d)
        carry += tl.sum(spans, axis=0)


@triton.jit
def mma_token_order(x, CODES: tl.constexpr):
    """x [R, C] with tokens along its columns in order (C a multiple of 16) -> the same
    values with each 16-column group in the transposed codes' order for operand format CODES.
    E4M3: column 4 t + 2 j + e of a group holds token 8 j + 2 t + e. An FP8 wgmma accumulator
    gives lane t % 4 of each quad its columns 8 j + 2 (t % 4) + e; the register A operand
    (k = 32) wants in lane t % 4 the columns 4 (t % 4) + q of each 16: in this order they are
    the same registers, so the kernels convert ``mma_token_order(P)`` to the A operand without
    data movement (``assert_trivial`` in Gluon). BF16: the A operand (k = 16) wants the
    accumulator's own columns, so the order is the identity."""
    if CODES != tl.bfloat16:
        R: tl.constexpr = x.shape[0]
        C: tl.constexpr = x.shape[1]
        x = tl.reshape(x, [R, C // 16, 2, 4, 2])  # [R, group, j, t, e]
        x = tl.reshape(tl.permute(x, [0, 1, 3, 2, 4]), [R, C])
    return x


def token_columns(i: torch.Tensor, dtype: torch.dtype = torch.float8_e4m3fn) -> torch.Tensor:
    """The column offset, from its document's first column, of each document-local token
    index i (any integer tensor) in codes of ``dtype``: ``mma_token_order``'s permutation in
    torch (the identity for bf16)."""
    if dtype == torch.bfloat16:
        return i
    group, j, t, e = i & ~15, (i >> 3) & 1, (i >> 1) & 3, i & 1
    return group + 4 * t + 2 * j + e


def transposed_extent(total: int, num_docs: int) -> int:
    """T_t, the column count of the transposed codes: a host-known bound on cu_t[-1] (each
    document adds at most DOC_ALIGN - 1 columns of padding), a multiple of DOC_ALIGN. It
    exceeds cu_t[-1] by less than DOC_ALIGN * (num_docs + 1) columns."""
    return -(-total // DOC_ALIGN) * DOC_ALIGN + DOC_ALIGN * num_docs


# The quantizers' column math, shared by the Triton kernels (quantize.py) and the Gluon one
# (rotated_quantizer.py). Gluon's aranges need explicit layouts, so the index vectors come in
# as arguments (tl.arange or gl.arange results) and nothing here makes a tensor of its own.


@triton.jit
def column_offsets(o_d, o_c, h, T_t, D: tl.constexpr):
    """Element offsets [len(o_d), len(o_c)] of head-dim rows o_d (int64) and columns o_c of
    head h in a [H, D, T_t] tensor."""
    return (h * D + o_d[:, None]) * T_t + o_c[None, :]


@triton.jit
def unit_columns(cu_seqlens_t, doc, length, o_i, T_ALIGN: tl.constexpr):
    """Columns of column positions o_i (int32; a quantizer puts its tokens there in
    ``mma_token_order``) of document doc, ``length`` tokens long: (cols int64, valid). Valid
    columns span the document's tokens and the padding up to its next multiple of T_ALIGN;
    the quantizers load a unit's rows past its document's end as zeros, so that gap gets
    zero codes."""
    first = tl.multiple_of(tl.load(cu_seqlens_t + doc), T_ALIGN).to(tl.int64)
    return first + o_i, o_i < tl.cdiv(length, T_ALIGN) * T_ALIGN


@triton.jit
def zero_padding(p_t, cu_seqlens_t, doc, length, num_docs, h, o_d, o_j, T_t, D: tl.constexpr,
                 T_ALIGN: tl.constexpr):
    """Zero the columns of head h of a [H, D, T_t] FP8 tensor that no quantizer unit writes
    (the kernels call it in the document's unit 0), so that no byte of the tensor stays
    uninitialised: document doc's padding past its tokens' last multiple of T_ALIGN, up to
    cu_t[doc + 1] (less than DOC_ALIGN columns), and its share of the tail [cu_t[-1], T_t).
    The tail is shorter than DOC_ALIGN * (num_docs + 1) <= 2 DOC_ALIGN * num_docs columns
    (``transposed_extent``): 2 DOC_ALIGN columns per document cover it. length: the
    document's tokens; o_d: the D head-dim rows (int64); o_j: arange(0, 2 T_ALIGN), the
    columns of one store."""
    CHUNK: tl.constexpr = 2 * T_ALIGN
    PAD_CHUNKS: tl.constexpr = (_DOC_ALIGN - T_ALIGN + CHUNK - 1) // CHUNK
    first = tl.multiple_of(tl.load(cu_seqlens_t + doc), T_ALIGN).to(tl.int64)
    pad = first + tl.cdiv(length, T_ALIGN) * T_ALIGN
    pad_end = tl.load(cu_seqlens_t + doc + 1).to(tl.int64)
    tail = tl.multiple_of(tl.load(cu_seqlens_t + num_docs), T_ALIGN).to(tl.int64) + doc * (2 * _DOC_ALIGN)
    # one store body in a loop: unrolled, each [D, CHUNK] store's offsets would stay live
    for c in range(0, PAD_CHUNKS + 2 * _DOC_ALIGN // CHUNK):
        is_pad = c < PAD_CHUNKS
        o_c = tl.multiple_of(tl.where(is_pad, pad + c * CHUNK, tail + (c - PAD_CHUNKS) * CHUNK), T_ALIGN) + o_j
        end = tl.multiple_of(tl.where(is_pad, pad_end, T_t), T_ALIGN)  # keeps the mask whole over 16-byte vectors
        # a scalar zero takes the offsets' shape and layout (tl.zeros would have no layout in Gluon)
        tl.store(p_t + column_offsets(o_d, o_c, h, T_t, D), 0.0, mask=(o_c < end)[None, :])


def transposed_reference(codes: torch.Tensor, cu_seqlens: torch.Tensor,
                         dtype: torch.dtype = torch.float8_e4m3fn) -> torch.Tensor:
    """The layout in torch, for tests: codes [T, H, D] (any dtype) -> [H, D, T_t] of that
    dtype, token i of document b at column cu_t[b] + token_columns(i, dtype) and zeros
    elsewhere; ``dtype``: the codes' format (bf16: tokens in order)."""
    total, heads, d = codes.shape
    rows = torch.arange(total, dtype=cu_seqlens.dtype, device=codes.device)
    doc = torch.searchsorted(cu_seqlens[1:], rows, right=True)  # [T] each row's document
    cols = aligned_starts_reference(cu_seqlens)[doc] + token_columns(rows - cu_seqlens[doc], dtype)
    out = codes.new_zeros((heads, d, transposed_extent(total, cu_seqlens.numel() - 1)))
    out[:, :, cols.long()] = codes.permute(1, 2, 0)
    return out
