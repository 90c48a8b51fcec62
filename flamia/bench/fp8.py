"""Per-tensor FP8 (E4M3) quantization for the FP8 peers, on the device without host syncs.

Scales are powers of two, so scaling a bf16 tensor is exact and the descale is an exact
reciprocal. The peers call this inside the timed call, as a training step on new tensors
must: the scale comes from the tensor's own amax.
"""
import torch

from ..formats.e4m3 import E4M3_MAX

FP8 = torch.float8_e4m3fn


def pow2_scale(amax: torch.Tensor) -> torch.Tensor:
    """The largest power of two s with amax * s <= 448, fp32, same shape as ``amax``."""
    exponent = torch.floor(torch.log2(E4M3_MAX / amax.float().clamp(min=2.0**-126)))
    return torch.exp2(exponent.clamp(-126, 126))


def quantize_per_tensor(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (bf16) -> (x * s in E4M3, descale 1/s as a 0-d fp32 tensor)."""
    scale = pow2_scale(x.abs().amax())
    # A 0-d fp32 scale keeps the product in x's dtype; a power of two scales bf16 exactly.
    return (x * scale).to(FP8), scale.reciprocal()
