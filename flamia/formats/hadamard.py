"""The normalized Hadamard rotation of the head dimension (paper 3.4 and A.2).

Written as a fast Walsh-Hadamard transform with a fixed butterfly order in fp32, followed by
one multiply with fp32(1/sqrt(D)). Every step is a single IEEE operation, so the Triton
quantizer, which applies the same butterflies in the same order, produces the same bits.
The Sylvester matrix is symmetric and H @ H = D * I, so the normalized rotation is its own
inverse: gradients are rotated back with the same function.
"""
import math

import torch

HADAMARD_DIMS = (64, 128, 256)


def hadamard_transform(x: torch.Tensor) -> torch.Tensor:
    """x @ (H_D / sqrt(D)) along the last axis, in fp32. x: [..., D], D in {64, 128, 256}."""
    d = x.shape[-1]
    if d not in HADAMARD_DIMS:
        raise ValueError(f"hadamard: head_dim must be one of {HADAMARD_DIMS}, got {d}")
    y = x.float()
    lead = y.shape[:-1]
    h = 1
    while h < d:
        y = y.reshape(*lead, d // (2 * h), 2, h)
        a, b = y[..., 0, :], y[..., 1, :]
        y = torch.stack((a + b, a - b), dim=-2)
        h *= 2
    return y.reshape(*lead, d) * torch.tensor(1.0 / math.sqrt(d), dtype=torch.float32)


def hadamard_matrix(d: int) -> torch.Tensor:
    """The normalized D x D matrix (for tests and documentation)."""
    return hadamard_transform(torch.eye(d))
