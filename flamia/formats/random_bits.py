"""Counter-based random bits for the stochastic rounding of G (NUMERICS.md 6): one uint32
word per (seed, stream, query row, key), a hash of those alone, so a kernel and the emulator
that visit the elements in any order draw the same bits.

    word = mix32(row_key(seed, stream, R) ^ key_key(j)),  R = h * Tq + i (packed query row i
                                                         of query head h), j the packed key
    row_key = mix32(mix32(R_lo ^ seed_lo) ^ R_hi ^ seed_hi ^ STREAMS[stream])
    key_key = j * 0x9E3779B9 (mod 2^32)

``mix32`` is the ``lowbias32`` integer hash (two multiplies, three xor-shifts): a bijection of
uint32 with a low avalanche bias. The row and key parts are per row and per column of a tile, so a
kernel pays one xor and one ``mix32`` per score. Distinct rows get distinct row keys (the
inner ``mix32`` is a bijection of R_lo); XOR with the odd multiple of j scatters, rather than
shifts, any coincidence of two rows' streams. uint32 words are held in int64 tensors (torch
has no uint32 arithmetic on every device).
"""
import torch

MASK = 0xFFFFFFFF
MIX_A, MIX_B = 0x7FEB352D, 0x846CA68B
KEY_MUL = 0x9E3779B9
STREAMS = (0x68E31DA4, 0xB5297A4D)  # G in dQ (its row groups), G in dK (its column groups)
ROUND_BITS = 22  # random bits a stochastic rounding adds below E2M1's kept mantissa bit
ROUND_MASK = (1 << ROUND_BITS) - 1


def mix32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 of uint32 words x (int64 tensor): xor-shift 16, * MIX_A, xor-shift 15, * MIX_B,
    xor-shift 16, every product mod 2^32."""
    x = x ^ (x >> 16)
    x = (x * MIX_A) & MASK
    x = x ^ (x >> 15)
    x = (x * MIX_B) & MASK
    return x ^ (x >> 16)


def row_key(seed: int, stream: int, rows: torch.Tensor) -> torch.Tensor:
    """uint32 key (int64 tensor) of packed rows R = h * Tq + i (non-negative, below 2^63) for one
    stream (0: G in dQ, 1: G in dK) and a seed in [0, 2^64)."""
    if not 0 <= seed < 1 << 64:
        raise ValueError(f"seed: must be in [0, 2^64), got {seed}")
    rows = rows.long()
    inner = mix32((rows & MASK) ^ (seed & MASK))
    return mix32(inner ^ ((rows >> 32) & MASK) ^ (seed >> 32) ^ STREAMS[stream])


def key_key(keys: torch.Tensor) -> torch.Tensor:
    """uint32 key (int64 tensor) of packed keys j (non-negative, below 2^32)."""
    return (keys.long() * KEY_MUL) & MASK


def grad_bits(seed: int, stream: int, rows: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """uint32 words (int64 tensor, rows and keys broadcast) that round G's element at packed row
    R = h * Tq + i and packed key j in ``stream``."""
    return mix32(row_key(seed, stream, rows) ^ key_key(keys))


def round_bits(words: torch.Tensor) -> torch.Tensor:
    """The ROUND_BITS random bits (int64, in [0, 2^22)) that a stochastic rounding takes from
    uint32 words (int64 tensor): their top bits."""
    return words >> (32 - ROUND_BITS)
