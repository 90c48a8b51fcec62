"""FP4 E2M1: the eight magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6}, round-to-nearest-even, two
codes per byte (low nibble first). Hopper has no FP4 MMA: the 4-bit recipes decode these
values into BF16, which holds every E2M1 x E4M3 product exactly.
"""
import torch

from .random_bits import ROUND_MASK, round_bits

E2M1_MAX = 6.0
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Midpoints between neighbours and which side a tie goes to (the one with an even code).
_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """Nearest E2M1 code (uint8 0..15, bit 3 = sign) of fp32 ``x``; |x| <= 6 is the caller's
    promise (larger values take code 7, the largest). Ties go to the even code."""
    a = x.float().abs()
    mid = torch.tensor(_MIDPOINTS, device=x.device)
    idx = torch.bucketize(a, mid)  # index of first midpoint >= a: ties land on the lower code
    tie = (idx < len(_MIDPOINTS)) & (a == mid[idx.clamp(max=len(_MIDPOINTS) - 1)])
    idx = torch.where(tie & (idx % 2 == 1), idx + 1, idx)  # a tie goes to the even code
    sign = (x < 0).to(torch.uint8) << 3
    return idx.to(torch.uint8) | sign


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """fp32 values of uint8 codes (0..15)."""
    table = torch.tensor(E2M1_VALUES, device=codes.device)
    mag = table[(codes & 7).long()]
    return torch.where((codes & 8) != 0, -mag, mag)


def round_to_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Round to the E2M1 grid (fp32 values), nearest, ties to even; |x| > 6 saturates to 6.
    Plain fp32 arithmetic, as ``round_to_e4m3`` does it: divide by the grid spacing at |x|
    (0.5 below 2, 1 below 4, then 2), round half to even, multiply back. Several times faster
    than going through the codes, which the emulator's per-tile P and G rounding needs; the
    tests check it against ``e2m1_decode(e2m1_codes(x))``."""
    x = x.float()
    a = x.abs()
    ulp = torch.where(a < 2.0, 0.5, torch.where(a < 4.0, 1.0, 2.0))
    return (torch.round(x / ulp) * ulp).clamp(-E2M1_MAX, E2M1_MAX)


def round_to_e2m1_stochastic(x: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
    """Round to the E2M1 grid stochastically (fp32 values) as a hardware stochastic convert
    does: 22 random bits (``random_bits.round_bits(words)``, words uint32 in an int64 tensor
    shaped like x) are added to the 22 bits of |x| below its kept mantissa bit and the sum is
    truncated, so |x| between grid neighbours lo and hi goes to hi with probability
    (|x| - lo) / (hi - lo) in steps of 2^-22. Below 1 the kept bit is the spacing's 0.5:
    those magnitudes go through |x| + 1 (fp32, nearest: their bits below 2^-23 round
    first) and back. The sign is kept; |x| > 6 saturates to 6. Integer and exact fp32
    steps, so a kernel that draws the same words rounds alike."""
    x = x.float()
    a = x.abs().clamp(max=E2M1_MAX)
    off = (a < 1.0).float()
    z = (a + off).view(torch.int32) + (ROUND_MASK - round_bits(words)).to(torch.int32)
    mag = (z & ~ROUND_MASK).view(torch.float32) - off
    return torch.where(x < 0, -mag, mag)


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [..., N] (N even) -> [..., N / 2] uint8, two codes per byte, low nibble first."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of ``pack_e2m1``: uint8 [..., N / 2] -> uint8 codes [..., N]."""
    return torch.stack((packed & 15, packed >> 4), dim=-1).flatten(-2)
