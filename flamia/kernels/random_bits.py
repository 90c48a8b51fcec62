"""The random bits that round the all-4-bit route's G stochastically, bit for bit
``formats.random_bits`` (NUMERICS.md 6): the row and key parts once per tile row and column,
then one xor and one ``mix32`` per score."""
import triton
import triton.language as tl

from ..formats.random_bits import KEY_MUL, MIX_A, MIX_B, STREAMS

_MIX_A = tl.constexpr(MIX_A)
_MIX_B = tl.constexpr(MIX_B)
_KEY_MUL = tl.constexpr(KEY_MUL)
_STREAM_DQ = tl.constexpr(STREAMS[0])
_STREAM_DK = tl.constexpr(STREAMS[1])


@triton.jit
def mix32(x):
    """lowbias32 of uint32 x (``formats.random_bits.mix32``); the products wrap mod 2^32."""
    x = x ^ (x >> 16)
    x = x * _MIX_A
    x = x ^ (x >> 15)
    x = x * _MIX_B
    return x ^ (x >> 16)


@triton.jit
def row_key(seed, row0, o_row, STREAM: tl.constexpr):
    """uint32 keys [N] of packed rows R = row0 + o_row (``formats.random_bits.row_key``), row0
    an int64 scalar, o_row [N]; STREAM 0: G in dQ, 1: G in dK. seed: an int in [0, 2^63),
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
