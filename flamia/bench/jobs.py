"""The timed call of each mode, built from a provider's forward and backward.

fwd    the forward alone.
bwd    the backward alone: the forward runs once while the job is built, outside the
       timed region, and every call reuses its saved state.
train  forward then backward, as one training step on new tensors runs them (providers
       that quantize do it inside the call).
"""
from typing import Callable, TypeVar

import torch

from ..workload import PackedInputs
from .timing import Job

MODES = ("fwd", "bwd", "train")
State = TypeVar("State")


def check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")


def staged_job(forward: Callable[[], State], backward: Callable[[State], object], mode: str) -> Job:
    """The job of ``mode`` from ``forward() -> state`` and ``backward(state)``."""
    check_mode(mode)
    if mode == "fwd":
        return forward
    if mode == "train":
        return lambda: backward(forward())
    state = forward()
    return lambda: backward(state)


def autograd_job(attention: Callable[..., torch.Tensor], inputs: PackedInputs, mode: str) -> Job:
    """The job of ``mode`` for a differentiable ``attention(q, k, v) -> out [T, Hq, D]``;
    the backward is torch.autograd.grad of out against ``inputs.do``."""
    check_mode(mode)
    q, k, v = (x.detach().clone().requires_grad_(mode != "fwd") for x in (inputs.q, inputs.k, inputs.v))

    def forward():
        return attention(q, k, v)

    def backward(out):
        # bwd replays the backward of one saved forward, so its graph must survive each call.
        return torch.autograd.grad(out, (q, k, v), inputs.do, retain_graph=mode == "bwd")

    return staged_job(forward, backward, mode)


def forward_only(mode: str) -> None:
    """Guard of inference-only builders (the registry's rules keep other modes away)."""
    if mode != "fwd":
        raise ValueError(f"mode: this provider has a forward only, got {mode!r}")
