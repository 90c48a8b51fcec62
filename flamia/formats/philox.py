"""Counter-based random bits, bit for bit Triton's ``tl.randint4x(seed, offset)``: Philox4x32
with 10 rounds, counter (offset low word, offset high word, 0, 0) and key (seed low word,
seed high word). A kernel and the emulator that draw at the same (seed, offset) get the same
bits, whatever order they visit the elements in.

uint32 words are held in int64 tensors (torch has no uint32 arithmetic on every device).
"""
import torch

_KEY_A, _KEY_B = 0x9E3779B9, 0xBB67AE85
_ROUND_A, _ROUND_B = 0xD2511F53, 0xCD9E8D57
_MASK = 0xFFFFFFFF
ROUNDS = 10


def _mulhilo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact (high, low) 32-bit words of a * b for a uint32 constant and uint32 words b."""
    a_hi, a_lo = a >> 16, a & 0xFFFF
    b_hi, b_lo = b >> 16, b & 0xFFFF
    ll = a_lo * b_lo
    lh = a_lo * b_hi
    hl = a_hi * b_lo
    hh = a_hi * b_hi
    mid = (ll >> 16) + (lh & 0xFFFF) + (hl & 0xFFFF)
    low = ((mid & 0xFFFF) << 16) | (ll & 0xFFFF)
    high = hh + (lh >> 16) + (hl >> 16) + (mid >> 16)
    return high & _MASK, low


def randint4x(seed: int, offset: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Four uint32 words (int64 tensors shaped like ``offset``) per element of ``offset``
    (non-negative integers below 2^64, any integer dtype), for an integer ``seed`` in [0, 2^64)."""
    if not 0 <= seed < 1 << 64:
        raise ValueError(f"seed: must be in [0, 2^64), got {seed}")
    offset = offset.long()
    c0, c1 = offset & _MASK, (offset >> 32) & _MASK
    c2 = c3 = torch.zeros_like(c0)
    k0, k1 = seed & _MASK, (seed >> 32) & _MASK
    for _ in range(ROUNDS):
        hi_b, lo_b = _mulhilo(_ROUND_B, c2)
        hi_a, lo_a = _mulhilo(_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0, k1 = (k0 + _KEY_A) & _MASK, (k1 + _KEY_B) & _MASK
    return c0, c1, c2, c3


def uniform24(bits: torch.Tensor) -> torch.Tensor:
    """fp32 in [0, 1) from the top 24 bits of uint32 words (int64): exact, multiples of 2^-24."""
    return (bits >> 8).float() * 2.0 ** -24
