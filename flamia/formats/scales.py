"""Power-of-two scale exponents (UE8M0-like, stored as int8).

A group's exponent is the smallest integer e with amax * 2^-e <= qmax, i.e.
ceil(log2(amax / qmax)), so the scaled maximum never exceeds the largest code and nothing is
clamped (paper 3.2: round the exponent *up*). It is computed from the bits of amax with
integer arithmetic only, so that torch and the Triton kernels agree exactly:
amax = M * 2^E with M in [1, 2) and qmax = Mq * 2^Eq gives e = E - Eq + (M > Mq).
Exponents are clamped to [-100, 127]: products of two or three such factors (and 2^sigma) then
stay normal fp32 numbers, so every fold below is exact; blocks whose max is under 448 * 2^-100
(~3.5e-28) underflow to E4M3 subnormals or zero, as any quantizer must;
an all-zero group gets -100.
"""
import struct

import torch

EXP_MIN = -100
EXP_MAX = 127


def _split(qmax: float) -> tuple[int, int]:
    """(Eq, mantissa bits of Mq) of a positive fp32 constant, in plain Python (no tensor, so
    nothing to synchronise or to break a torch.compile graph)."""
    (bits,) = struct.unpack("<I", struct.pack("<f", qmax))
    return ((bits >> 23) & 0xFF) - 127, bits & 0x7FFFFF


def scale_exponent(amax: torch.Tensor, qmax: float) -> torch.Tensor:
    """int32 exponents e (same shape as ``amax``, which must be finite and >= 0)."""
    eq, mq = _split(qmax)
    bits = amax.float().contiguous().view(torch.int32)
    e_amax = ((bits >> 23) & 0xFF) - 127
    e = e_amax - eq + ((bits & 0x7FFFFF) > mq).to(torch.int32)
    e = torch.where(e_amax == -127, torch.full_like(e, EXP_MIN), e)  # zero or fp32-subnormal amax
    return e.clamp(EXP_MIN, EXP_MAX)


def exp2i(e: torch.Tensor) -> torch.Tensor:
    """Exact fp32 2^e for integer tensors e in [-126, 127]."""
    return torch.ldexp(torch.ones(e.shape, device=e.device), e.to(torch.int32))
