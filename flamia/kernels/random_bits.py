"""The random bits that round the all-4-bit route's G stochastically, bit for bit
``formats.random_bits`` (NUMERICS.md 6). ``mix32``'s first step is linear over xor, so a word
is ``mix32_rest(row_part(R) ^ xorshift16(key_key(j)))``: one launch stores each query row's
part per stream (``grad_row_parts``), the backward kernels load it once per tile row and take
the key part once per column, and a score pays one xor and ``mix32``'s last four steps."""
import torch
import triton
import triton.language as tl

from ..formats.random_bits import KEY_MUL, MIX_A, MIX_B, STREAMS
from .launch import PACKING_INTS, cdiv, launch

_MIX_A = tl.constexpr(MIX_A)
_MIX_B = tl.constexpr(MIX_B)
_KEY_MUL = tl.constexpr(KEY_MUL)
_STREAM_DQ = tl.constexpr(STREAMS[0])
_STREAM_DK = tl.constexpr(STREAMS[1])


@triton.jit
def xorshift16(x):
    """uint32 x ^ (x >> 16): mix32's first step, linear over xor, so
    ``xorshift16(a ^ b) == xorshift16(a) ^ xorshift16(b)``."""
    return x ^ (x >> 16)


@triton.jit
def mix32_rest(x):
    """``mix32`` of the uint32 word whose ``xorshift16`` is x; the products wrap mod 2^32."""
    x = x * _MIX_A
    x = x ^ (x >> 15)
    x = x * _MIX_B
    return x ^ (x >> 16)


@triton.jit
def mix32(x):
    """lowbias32 of uint32 x (``formats.random_bits.mix32``)."""
    return mix32_rest(xorshift16(x))


@triton.jit
def row_key(seed, row0, o_row, STREAM: tl.constexpr):
    """uint32 keys [N] of packed rows R = row0 + o_row (``formats.random_bits.row_key``), row0
    an int64 scalar, o_row [N]; STREAM 0: G in dQ, 1: G in dK. seed: an int in [0, 2^64),
    a constant where a launch specialized it (1)."""
    seed = (row0 * 0 + seed).to(tl.uint64)  # a tensor whatever the launch made of the seed
    rows = row0 + o_row.to(tl.int64)
    seed_lo = (seed & 0xFFFFFFFF).to(tl.uint32)
    seed_hi = (seed >> 32).to(tl.uint32)
    if STREAM == 0:
        stream = _STREAM_DQ
    else:
        stream = _STREAM_DK
    inner = mix32(rows.to(tl.uint32) ^ seed_lo)
    return mix32(inner ^ (rows >> 32).to(tl.uint32) ^ (seed_hi ^ stream))


@triton.jit
def key_key(key0, o_key):
    """uint32 keys [N] of packed keys j = key0 + o_key (``formats.random_bits.key_key``), key0
    an int64 scalar, o_key [N]; j below 2^32."""
    return (key0 + o_key.to(tl.int64)).to(tl.uint32) * _KEY_MUL


@triton.jit
def row_part(seed, row0, o_row, STREAM: tl.constexpr):
    """``xorshift16(row_key(...))`` [N] uint32: the part every word of row R = row0 + o_row
    takes from its row, after ``mix32``'s first step."""
    return xorshift16(row_key(seed, row0, o_row, STREAM))


_ROWS = 1024  # rows per program of ``grad_row_parts``


@triton.jit(do_not_specialize=PACKING_INTS)
def _row_parts_kernel(p_out, seed, n_rows, N: tl.constexpr):
    """Program (chunk of N rows): both streams' ``row_part`` of rows R [N] into p_out [2, n_rows]."""
    row0 = tl.program_id(0).to(tl.int64) * N  # the chunk's first packed row h Tq + i
    o_r = tl.arange(0, N)  # [N]
    m_r = row0 + o_r < n_rows
    for stream in tl.static_range(2):
        b_part = row_part(seed, row0, o_r, stream)
        tl.store(p_out + stream * n_rows + row0 + o_r, b_part.to(tl.int32, bitcast=True), mask=m_r)


def grad_row_parts(seed: int, heads_q: int, total_q: int, device) -> torch.Tensor:
    """[2, Hq, Tq] int32 (uint32 bits): ``row_part`` of every packed query row R = h Tq + i
    for stream 0 (G in dQ) and 1 (G in dK), for seed in [0, 2^64)."""
    if not 0 <= seed < 1 << 64:
        raise ValueError(f"seed: must be in [0, 2^64), got {seed}")
    out = torch.empty((2, heads_q, total_q), dtype=torch.int32, device=device)
    n_rows = heads_q * total_q
    if n_rows:
        launch(_row_parts_kernel, (cdiv(n_rows, _ROWS),), out, seed, n_rows, N=_ROWS)
    return out
