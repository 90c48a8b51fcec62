"""4-bit block formats (NUMERICS.md 1 and 6): NVFP4, and E2M1 under a power-of-two scale.

NVFP4: E2M1 codes, one E4M3 scale per 16 consecutive elements of the last axis, and one
power-of-two scale ``g = 2^(e - 2)`` per row (one token of one head), where ``e`` is the
E4M3 scale exponent (``scale_exponent(amax, 448)``) of the rows that share it: the row
alone, the rows of a token block (the mixed route's Q and K share their MXFP8 operands'
exponents), or the tensor (the leaking ablation). A power of two folds into the kernels'
exponent factors exactly, as the MXFP8 route's do; E4M3 scales have the same relative
precision anywhere in their normal range, so where g sits changes only which tiny groups go
subnormal. ``amax <= 448 * 2^e`` bounds every ``amax16 / (6 * g)`` by 448 * 4 / 6 < 448: no
scale clamps.

Order of operations, fp32, one IEEE rounding per step:
- ``s = e4m3_round_up(amax16 / (6 * g))``, and one E4M3 step higher where the group's
  maximum would still scale above 6, ``amax16 / (s * g) > 6`` (with g a power of two the
  rounded ratio passes a grid value whenever the exact one does, so this happens only where
  the ratio underflows);
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
NVFP4_G_SHIFT = 2  # g = 2^(e - 2): the largest group's scale lands in (149, 299], below 448


@dataclass(frozen=True)
class Nvfp4Tensor:
    """codes: uint8 E2M1 codes [..., D]; scales: fp32 E4M3 values [..., D / 16];
    exps: int32 [...], the rows' scale exponents e (g = 2^(e - 2))."""

    codes: torch.Tensor
    scales: torch.Tensor
    exps: torch.Tensor

    @property
    def g(self) -> torch.Tensor:
        """The per-row scale 2^(e - 2), fp32 [...]."""
        return exp2i(self.exps - NVFP4_G_SHIFT)

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


def _group_scale(amax16: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The E4M3 scale of each 16-group: amax16 [..., D/16], g [..., 1]."""
    s = e4m3_round_up(amax16 / (E2M1_MAX * g))
    over = amax16 / (s * g) > E2M1_MAX
    return torch.where(over, s + e4m3_ulp(s), s)


def quantize_nvfp4(x: torch.Tensor, exps: "torch.Tensor | None" = None, per_tensor: bool = False) -> Nvfp4Tensor:
    """x: [..., D] float, D a multiple of 16 -> NVFP4 along the last axis. exps: int32 [...],
    the rows' scale exponents (``scale_exponent`` of the max |x| over the rows that share
    g, 448); None: each row's own, or the tensor's when ``per_tensor`` (the leaking ablation)."""
    d = x.shape[-1]
    if d % NVFP4_GROUP:
        raise ValueError(f"x: NVFP4 needs the last dim to be a multiple of {NVFP4_GROUP}, got {d}")
    xf = x.float()
    if exps is None:
        amax = xf.abs().amax() if per_tensor else xf.abs().amax(-1)
        exps = scale_exponent(amax, E4M3_MAX).expand(x.shape[:-1])
    if exps.shape != x.shape[:-1]:
        raise ValueError(f"exps: one per row, shape {tuple(x.shape[:-1])}, got {tuple(exps.shape)}")
    g = exp2i(exps - NVFP4_G_SHIFT)
    groups = xf.unflatten(-1, (d // NVFP4_GROUP, NVFP4_GROUP))  # [..., D/16, 16]
    s = _group_scale(groups.abs().amax(-1), g[..., None])       # [..., D/16]
    if not bool((s <= E4M3_MAX).all()):
        raise AssertionError("nvfp4: an E4M3 group scale exceeds 448 (exps below the rows' maxima?)")
    denom = (s * g[..., None])[..., None]
    scaled = torch.where(denom > 0, groups / denom, torch.zeros((), device=x.device))
    if not bool((scaled.abs() <= E2M1_MAX).all()):
        raise AssertionError("nvfp4: a scaled value exceeds 6 (its code would clamp)")
    return Nvfp4Tensor(e2m1_codes(scaled.flatten(-2)), s, exps.to(torch.int32))


def round_e2m1_pow2(x: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """E2M1 under a power-of-two group scale (4-bit P, and the all-4-bit route's operands
    contracted over tokens): ``e2m1(x * 2^-e) * 2^e`` with ``e = scale_exponent(amax, 6)``,
    so nothing clamps. x: [...] fp32; amax: broadcastable to x, >= the group's max |x|.
    Returns the fp32 values (exact)."""
    e = scale_exponent(amax, E2M1_MAX)
    return round_to_e2m1(x * exp2i(-e)) * exp2i(e)
