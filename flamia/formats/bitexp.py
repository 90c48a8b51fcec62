"""Bit-level exponentials (paper 3.7, Appendix C): inference-only approximations, emulated.

Schraudolph's exponential writes ``x`` in fixed point into the bits of a BF16 number: the
integer part of x lands in the exponent field and 7 fraction bits in the mantissa, giving
the piecewise-linear 2^floor(x) * (1 + frac(x)). An additive offset in the bit domain centres
the ratio to the exact 2^x so that its mean error is zero. Used here only by the
``fwd_approx_exp`` ablation, which shows why training must not use it in one pass only.

Mitchell-P builds the same piecewise-linear 2^x for the 4-bit P quantizer with ordinary
arithmetic (NUMERICS.md 7): an FFMA writes x in fixed point (16 fraction bits) into an fp32
mantissa, an integer shift-add moves it into the exponent and mantissa fields, a constant
offset centres the error, and an integer max keeps any score range valid. E2M1's magnitudes
are >= 33 % apart, so the few-percent error rarely changes a code. Not used by any recipe.
"""
import math

import torch

from .e2m1 import E2M1_MAX
from .e2m1 import round_to_e2m1
from .nvfp4 import round_e2m1_pow2
from .scales import exp2i, scale_exponent

_BF16_MANTISSA = 128.0  # 2^7 fraction steps per unit of x


def _mean_log2_ratio() -> float:
    """Mean of log2((1 + f) / 2^f) over f in [0, 1): the bias of the linear approximation."""
    f = torch.linspace(0, 1, 1 << 16, dtype=torch.float64)[:-1]
    return float(torch.log2((1 + f) / torch.exp2(f)).mean())


SCHRAUDOLPH_OFFSET = -_mean_log2_ratio() * _BF16_MANTISSA


def schraudolph_exp2(x: torch.Tensor) -> torch.Tensor:
    """Approximate 2^x (fp32 in, fp32 out); x <= 0 as softmax arguments are. Below 2^-126
    the pattern would wrap, so those results are 0."""
    xf = x.float()
    bits = torch.round((xf + 127.0) * _BF16_MANTISSA + SCHRAUDOLPH_OFFSET)
    ok = bits >= _BF16_MANTISSA  # exponent field >= 1
    bits = bits.clamp(min=0, max=255 * _BF16_MANTISSA - 1).to(torch.int32) << 16
    return torch.where(ok, bits.view(torch.float32), torch.zeros((), device=x.device))


# t = x + 252 has exponent 7 for x in [-124, 4): its mantissa holds (x + 124) * 2^16, x in
# fixed point with 16 fraction bits (about 86 nats of range below the group maximum).
_MITCHELL_MAGIC = 252.0
_MITCHELL_TOP = 4.0
_MITCHELL_FLOOR = 0x43000000  # bits of 128.0 (x = -124): the clamp for lower arguments
# (1 + f) / 2^f peaks at f = 1/ln2 - 1 with value c; lowering the mantissa field by d (with
# its borrow into the exponent) gives ratios in [2^-d, c * 2^-d]: 2^-d = 2 / (1 + c) puts
# both ends equally far from 1 (about 3 %).
_MITCHELL_PEAK = 2.0 ** (1.0 - 1.0 / math.log(2.0)) / math.log(2.0)
_MITCHELL_OFFSET = round((math.log2(1.0 + _MITCHELL_PEAK) - 1.0) * (1 << 23))
# The shift-add: mantissa bits << 7 puts the integer part of x + 124 into the exponent field;
# 3 << 23 turns it into the biased exponent floor(x) + 127.
_MITCHELL_BIAS = (3 << 23) - _MITCHELL_OFFSET


def mitchell_exp2(x: torch.Tensor, shift: torch.Tensor | float = 0.0) -> torch.Tensor:
    """Approximate 2^(x - shift) (fp32), with ``shift`` integer-valued (the row max plus the
    group's scale exponent) and x - shift < 4. One fp32 add (the FFMA), integer ops after it.
    Arguments below -124 give about 2^-124 (E2M1 code 0 under any group scale it meets)."""
    t = x.float() + (_MITCHELL_MAGIC - shift)
    if bool((t >= _MITCHELL_MAGIC + _MITCHELL_TOP).any()):
        raise ValueError("x: Mitchell-P needs x - shift < 4 (4-bit P arguments are <= log2 6)")
    bits = t.view(torch.int32).clamp(min=_MITCHELL_FLOOR).long()
    out = ((bits & 0x7FFFFF) << 7) + _MITCHELL_BIAS
    return out.to(torch.int32).view(torch.float32)


def mitchell_p(x: torch.Tensor, m: torch.Tensor, group: int = 32) -> torch.Tensor:
    """4-bit P (before the V fold) by Mitchell-P: per (row, ``group`` keys) the scale exponent
    eg from the approximate group maximum, then ``e2m1(2^(x - m - eg)) * 2^eg`` with the
    approximate exponential. x: [..., N] finite scores in log2 units (N a multiple of
    ``group``); m: [...] integer-valued row max >= max x. Returns fp32 values [..., N]."""
    xg = x.float().unflatten(-1, (-1, group))
    shift = m[..., None, None]
    eg = scale_exponent(mitchell_exp2(xg.amax(-1, keepdim=True), shift), E2M1_MAX)
    # The log-domain group scale (paper 3.5.2): eg enters the FFMA's constant, no multiply.
    return (round_to_e2m1(mitchell_exp2(xg, shift + eg)) * exp2i(eg)).flatten(-2)


def mitchell_code_match(x: torch.Tensor, group: int = 32, nonzero_only: bool = False) -> float:
    """Fraction of 4-bit P entries from Mitchell-P equal to exact rounding of the exact
    exponential (paper 3.7: 98.7 %). x: [..., N] finite scores in log2 units, one row per
    query, each row's max m = ceil(max x) as the forward's integer running max.
    ``nonzero_only``: count only entries that either side leaves nonzero (most small
    probabilities are 0 under both, which the plain fraction counts as matches)."""
    xf = x.float()
    m = torch.ceil(xf.amax(-1))
    xg = xf.unflatten(-1, (-1, group))
    p = torch.exp2(xg - m[..., None, None])
    exact = round_e2m1_pow2(p, p.amax(-1, keepdim=True)).flatten(-2)
    approx = mitchell_p(xf, m, group)
    counted = (exact != 0) | (approx != 0) if nonzero_only else torch.ones_like(exact, dtype=torch.bool)
    return float((exact == approx)[counted].double().mean())
