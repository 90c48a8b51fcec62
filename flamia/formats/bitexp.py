"""Bit-level exponentials (paper 3.7, Appendix C): inference-only approximations, emulated.

Schraudolph's exponential writes ``x`` in fixed point into the bits of a BF16 number: the
integer part of x lands in the exponent field and 7 fraction bits in the mantissa, giving
the piecewise-linear 2^floor(x) * (1 + frac(x)). An additive offset in the bit domain centres
the ratio to the exact 2^x so that its mean error is zero. Used here only by the
``fwd_approx_exp`` ablation, which shows why training must not use it in one pass only.
"""
import math

import torch

_BF16_MANTISSA = 128.0  # 2^7 fraction steps per unit of x


def _mean_log2_ratio() -> float:
    """Mean of log2((1 + f) / 2^f) over f in [0, 1): the bias of the linear approximation."""
    f = torch.linspace(0, 1, 1 << 16, dtype=torch.float64)[:-1]
    return float(torch.log2((1 + f) / torch.exp2(f)).mean())


_OFFSET = -_mean_log2_ratio() * _BF16_MANTISSA


def schraudolph_exp2(x: torch.Tensor) -> torch.Tensor:
    """Approximate 2^x (fp32 in, fp32 out); x <= 0 as softmax arguments are. Below 2^-126
    the pattern would wrap, so those results are 0."""
    xf = x.float()
    bits = torch.round((xf + 127.0) * _BF16_MANTISSA + _OFFSET)
    ok = bits >= _BF16_MANTISSA  # exponent field >= 1
    bits = bits.clamp(min=0, max=255 * _BF16_MANTISSA - 1).to(torch.int32) << 16
    return torch.where(ok, bits.view(torch.float32), torch.zeros((), device=x.device))
