"""FP8 E4M3 (``torch.float8_e4m3fn``): constants and bit-exact round-to-nearest-even.

The rounding is written in plain fp32 arithmetic (scale by an exact power of two, round half
to even, scale back) so that it runs the same on every device, and it is the order of
operations the Triton kernels use (``flamia.kernels.fp8``).
"""
import math

import torch

E4M3_MAX = 448.0
LOG2_E4M3_MAX = math.log2(E4M3_MAX)  # 8.807...: the tau + sigma bound of NUMERICS.md 3
E4M3_MANTISSA_BITS = 3
E4M3_MIN_NORMAL_EXP = -6  # smallest normal: 2^-6
E4M3_MIN_SUBNORMAL = 2.0**-9


def round_to_e4m3(x: torch.Tensor, saturate: bool = False) -> torch.Tensor:
    """Round to the E4M3 grid, half to even, in fp32. Returns fp32 values, same shape.

    Inputs must satisfy |x| <= 448 unless ``saturate`` (then larger magnitudes become 448,
    as the hardware's satfinite convert does). Callers that promise no saturation check it
    with :func:`assert_in_range`.
    """
    x = x.float()
    if saturate:
        x = x.clamp(-E4M3_MAX, E4M3_MAX)
    ulp = e4m3_ulp(x)
    return torch.round(x / ulp) * ulp


def e4m3_ulp(x: torch.Tensor) -> torch.Tensor:
    """Spacing of the E4M3 grid at fp32 ``x`` (the subnormal spacing 2^-9 below 2^-6)."""
    _, exp = torch.frexp(x)  # |x| = mant * 2^exp, mant in [0.5, 1)
    return torch.ldexp(torch.ones_like(x), (exp - 1).clamp(min=E4M3_MIN_NORMAL_EXP) - E4M3_MANTISSA_BITS)


def to_e4m3(x: torch.Tensor, saturate: bool = False) -> torch.Tensor:
    """Encode to ``torch.float8_e4m3fn`` codes with round-to-nearest-even."""
    return round_to_e4m3(x, saturate).to(torch.float8_e4m3fn)


def assert_in_range(x: torch.Tensor, what: str) -> None:
    """Raise if any |x| > 448: an E4M3 operand that would saturate is a bug, never hoped away."""
    amax = x.detach().abs().amax() if x.numel() else torch.zeros(())
    if not bool(amax <= E4M3_MAX):
        raise AssertionError(f"{what}: E4M3 operand reaches {float(amax):.4g} > {E4M3_MAX} (would saturate)")
