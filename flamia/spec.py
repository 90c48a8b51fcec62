"""The non-tensor description of one attention call, validated once by the API and handed
as a single object through autograd (so backward returns (dq, dk, dv, None))."""
from dataclasses import dataclass

import torch

from .recipes import Recipe


@dataclass(frozen=True)
class AttnSpec:
    """cu_seqlens_*: int32 [num_docs + 1] on the inputs' device; max_seqlen_*: host ints;
    window_size: (left, right), -1 = unbounded; softmax_scale: resolved (never None); seed:
    the random bits' seed of a recipe that rounds stochastically (0 otherwise)."""

    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int
    causal: bool
    softmax_scale: float
    window_size: tuple[int, int]
    recipe: Recipe
    seed: int = 0
