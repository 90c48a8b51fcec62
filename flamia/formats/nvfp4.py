"""4-bit block formats (NUMERICS.md 1 and 6): NVFP4, and E2M1 under a power-of-two scale.

NVFP4: E2M1 codes, one E4M3 scale per 16 consecutive elements of the last axis, and one fp32
scale ``g`` per row (one token of one head; per tensor only for the leaking ablation).

Order of operations, fp32, one IEEE rounding per step:
- ``g = amax / (6 * 448)`` with ``amax`` the row's max |x| (1 for an all-zero row); if the
  row's own maximum would still scale above 6 under the largest scale, i.e.
  ``amax / (448 * g) > 6`` after rounding, ``g`` moves up by one ulp;
- ``s = e4m3_round_up(amax16 / (6 * g))``, capped at 448, and one E4M3 step higher where the
  group's maximum would still scale above 6, ``amax16 / (s * g) > 6``;
- ``codes = e2m1(x / (s * g))`` (0 for an all-zero group).
Rounding the scales up, not to nearest, is what keeps every scaled value within [-6, 6]: no
code is ever clamped, and :func:`quantize_nvfp4` asserts it.
"""
from dataclasses import dataclass

import torch

from .e2m1 import E2M1_MAX, e2m1_codes, e2m1_decode, round_to_e2m1
from .e4m3 import E4M3_MAX, e4m3_ulp
from .scales import exp2i, scale_exponent

NVFP4_GROUP = 16


@dataclass(frozen=True)
class Nvfp4Tensor:
    """codes: uint8 E2M1 codes [..., D]; scales: fp32 E4M3 values [..., D / 16];
    g: fp32 per-row scale [...]."""

    codes: torch.Tensor
    scales: torch.Tensor
    g: torch.Tensor

    def values(self) -> torch.Tensor:
        """code x E4M3 scale, fp32 [..., D]: what multiplies in the MMA. Exact in BF16 (at
        most 2 + 4 significant bits, exponents within BF16's range)."""
        return e2m1_decode(self.codes) * self.scales.repeat_interleave(NVFP4_GROUP, dim=-1)

    def dequantize(self) -> torch.Tensor:
        """fp32 [..., D]."""
        return self.values() * self.g[..., None]


def e4m3_round_up(x: torch.Tensor) -> torch.Tensor:
    """The smallest E4M3 value >= x, for fp32 0 <= x <= 448 (fp32 result)."""
    ulp = e4m3_ulp(x)
    return torch.ceil(x / ulp) * ulp


def _row_scale(amax: torch.Tensor) -> torch.Tensor:
    """g from the row max, nudged up one ulp where the largest scale would not suffice."""
    one = torch.ones((), device=amax.device)
    # A tensor divisor on amax's device: CUDA divides by a Python number as a multiply by its
    # rounded reciprocal, which gives another g than the division for about 1 row in 5.
    g = torch.where(amax > 0, amax / torch.full((), E2M1_MAX * E4M3_MAX, device=amax.device), one)
    short = amax / (E4M3_MAX * g) > E2M1_MAX
    return torch.where(short, torch.nextafter(g, torch.full_like(g, float("inf"))), g)


def _group_scale(amax16: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The E4M3 scale of each 16-group: amax16 [..., D/16], g [..., 1]."""
    s = e4m3_round_up(amax16 / (E2M1_MAX * g)).clamp(max=E4M3_MAX)
    over = amax16 / (s * g) > E2M1_MAX
    return torch.where(over, s + e4m3_ulp(s), s)


def quantize_nvfp4(x: torch.Tensor, per_tensor: bool = False) -> Nvfp4Tensor:
    """x: [..., D] float, D a multiple of 16 -> NVFP4 along the last axis, one ``g`` per row
    (per tensor when ``per_tensor``: the tensor-wide scale of the leaking ablation)."""
    d = x.shape[-1]
    if d % NVFP4_GROUP:
        raise ValueError(f"x: NVFP4 needs the last dim to be a multiple of {NVFP4_GROUP}, got {d}")
    xf = x.float()
    amax = xf.abs().amax(-1)
    if per_tensor:
        amax = amax.amax().expand(amax.shape)
    g = _row_scale(amax)
    groups = xf.unflatten(-1, (d // NVFP4_GROUP, NVFP4_GROUP))  # [..., D/16, 16]
    s = _group_scale(groups.abs().amax(-1), g[..., None])       # [..., D/16]
    if not bool((s <= E4M3_MAX).all()):
        raise AssertionError("nvfp4: an E4M3 group scale exceeds 448")
    denom = (s * g[..., None])[..., None]
    scaled = torch.where(denom > 0, groups / denom, torch.zeros((), device=x.device))
    if not bool((scaled.abs() <= E2M1_MAX).all()):
        raise AssertionError("nvfp4: a scaled value exceeds 6 (its code would clamp)")
    return Nvfp4Tensor(e2m1_codes(scaled.flatten(-2)), s, g)


def round_e2m1_pow2(x: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """E2M1 under a power-of-two group scale (4-bit P, and the all-4-bit route's operands
    contracted over tokens): ``e2m1(x * 2^-e) * 2^e`` with ``e = scale_exponent(amax, 6)``,
    so nothing clamps. x: [...] fp32; amax: broadcastable to x, >= the group's max |x|.
    Returns the fp32 values (exact)."""
    e = scale_exponent(amax, E2M1_MAX)
    return round_to_e2m1(x * exp2i(-e)) * exp2i(e)
