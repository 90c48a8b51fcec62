"""Packed-document workloads and one training call (forward + backward) of an attention
callable: what the leakage probe, the accuracy report and the demo share.

An *attention callable* is any function
``attn(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal) -> (out, lse)``
with q [Tq, Hq, D], k and v [Tk, Hkv, D], out [Tq, Hq, D], lse [Hq, Tq], differentiable in
q, k and v. :func:`as_attention` turns a flamia recipe into one. lse may be None when the
implementation does not expose it (some peer libraries); a callable without a backward is
wrapped in :class:`ForwardOnly`, and its training call leaves dQ, dK and dV None.
"""
from dataclasses import dataclass, fields, replace
from typing import Callable

import torch

from .api import flash_attn_varlen_func
from .recipes import Recipe
from .reference.exact import exact_attention

Attention = Callable[..., tuple[torch.Tensor, "torch.Tensor | None"]]

# Outlier channels are this many times larger than the rest (a factor drawn per channel).
OUTLIER_RANGE = (20.0, 100.0)


@dataclass(frozen=True)
class PackedInputs:
    """Self-attention inputs on packed documents. q: [T, Hq, D]; k, v: [T, Hkv, D]; do (the
    upstream gradient of the output): [T, Hq, D]; all of one float dtype. cu_seqlens: int32
    [num_docs + 1]."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    do: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int

    @property
    def lengths(self) -> tuple[int, ...]:
        return tuple(int(n) for n in torch.diff(self.cu_seqlens).tolist())

    def doc_rows(self, doc: int) -> slice:
        """Packed rows of document ``doc``."""
        return slice(int(self.cu_seqlens[doc]), int(self.cu_seqlens[doc + 1]))

    def with_(self, **changes) -> "PackedInputs":
        return replace(self, **changes)

    def first_heads(self, heads_q: int) -> "PackedInputs":
        """The same documents restricted to the first ``heads_q`` query heads and the KV
        heads they read (``heads_q`` a multiple of the GQA group size)."""
        group = self.q.shape[1] // self.k.shape[1]
        if heads_q % group or not 0 < heads_q <= self.q.shape[1]:
            raise ValueError(f"heads_q: must be a multiple of the group size {group} "
                             f"in [1, {self.q.shape[1]}], got {heads_q}")
        kv = heads_q // group
        return self.with_(q=self.q[:, :heads_q].contiguous(), k=self.k[:, :kv].contiguous(),
                          v=self.v[:, :kv].contiguous(), do=self.do[:, :heads_q].contiguous())


def make_packed_inputs(lengths, heads_q: int = 16, heads_kv: int | None = None, head_dim: int = 128,
                       dtype: torch.dtype = torch.bfloat16, outlier_channels: int = 0, seed: int = 0,
                       device: "str | torch.device" = "cpu") -> PackedInputs:
    """Random normal q, k, v, do for documents of the given ``lengths``, packed.

    ``outlier_channels``: per KV head, that many head-dim channels of K and V are multiplied by
    a factor drawn from ``OUTLIER_RANGE`` (the channel outliers of trained models' keys, which
    stress block scales and motivate the Hadamard rotation). Q stays normal so the softmax
    stays far from an argmax. Values are drawn on the CPU from ``seed``, so every device
    sees the same inputs.
    """
    lengths = [int(n) for n in lengths]
    if not lengths or min(lengths) < 0 or sum(lengths) < 1:
        raise ValueError(f"lengths: need documents of >= 0 tokens, at least one token in all, got {lengths}")
    heads_kv = heads_q if heads_kv is None else heads_kv
    if heads_q % heads_kv:
        raise ValueError(f"heads_kv: must divide heads_q={heads_q}, got {heads_kv}")
    if not 0 <= outlier_channels <= head_dim:
        raise ValueError(f"outlier_channels: must lie in [0, head_dim={head_dim}], got {outlier_channels}")
    gen = torch.Generator().manual_seed(seed)
    total = sum(lengths)

    def normal(heads):
        return torch.randn(total, heads, head_dim, generator=gen)

    q, k, v, do = normal(heads_q), normal(heads_kv), normal(heads_kv), normal(heads_q)
    if outlier_channels:
        gain = torch.ones(heads_kv, head_dim)
        low, high = OUTLIER_RANGE
        for h in range(heads_kv):
            channels = torch.randperm(head_dim, generator=gen)[:outlier_channels]
            gain[h, channels] = low + (high - low) * torch.rand(outlier_channels, generator=gen)
        k, v = k * gain, v * gain
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    to = dict(device=device, dtype=dtype)
    return PackedInputs(q.to(**to), k.to(**to), v.to(**to), do.to(**to), cu.to(device), max(lengths))


@dataclass(frozen=True)
class ForwardOnly:
    """An attention callable that has no backward on the workload at hand (an inference
    kernel, or a peer whose backward does not support these lengths or head dim), with
    ``why``. Calling it calls ``attn``; :func:`training_call` runs the forward alone, on
    inputs that do not require grad, and reports no gradients."""

    attn: Attention
    why: str

    def __call__(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal):
        return self.attn(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal)


@dataclass(frozen=True)
class TrainingCall:
    """Forward and backward of one attention call. out: [T, Hq, D]; lse: [Hq, T];
    dq: [T, Hq, D]; dk, dv: [T, Hkv, D]; dtypes as the callable returned them. lse is None
    when the callable does not return it, the gradients when it is :class:`ForwardOnly`."""

    out: torch.Tensor
    lse: torch.Tensor | None
    dq: torch.Tensor | None
    dk: torch.Tensor | None
    dv: torch.Tensor | None

    def by_name(self) -> dict[str, torch.Tensor | None]:
        """Quantity name -> tensor with the token on axis 0 (lse transposed to [T, Hq]), or
        None for a quantity the call did not produce."""
        lse = None if self.lse is None else self.lse.transpose(0, 1)
        return {"O": self.out, "LSE": lse, "dQ": self.dq, "dK": self.dk, "dV": self.dv}


def training_call(attn: Attention, inputs: PackedInputs, causal: bool = True) -> TrainingCall:
    """Run ``attn`` forward on ``inputs`` and, unless it is :class:`ForwardOnly`, backward
    with ``inputs.do``."""
    backward = not isinstance(attn, ForwardOnly)
    q, k, v = (x.detach().clone().requires_grad_(backward) for x in (inputs.q, inputs.k, inputs.v))
    cu, n = inputs.cu_seqlens, inputs.max_seqlen
    out, lse = attn(q, k, v, cu, cu, n, n, causal)
    grads = torch.autograd.grad(out, (q, k, v), inputs.do.to(out.dtype)) if backward else (None, None, None)
    return TrainingCall(out.detach(), None if lse is None else lse.detach(), *grads)


def as_attention(recipe: "str | Recipe | Attention", backend: str | None = None, seed: int | None = 0) -> Attention:
    """A recipe (name or ``flamia.Recipe``) -> an attention callable through
    ``flamia.flash_attn_varlen_func``; a callable is returned unchanged. seed: a stochastic
    recipe's seed, the same on every call (0) so that the tools' paired calls compare bit for
    bit; None draws one per call, as training does."""
    if callable(recipe):
        return recipe

    def attn(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal):
        return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                      causal=causal, recipe=recipe, backend=backend, return_lse=True, seed=seed)

    return attn


def exact_reference(dtype: torch.dtype = torch.float64) -> Attention:
    """``flamia.exact_attention`` computing in ``dtype`` (float64 or float32) as a callable."""

    def attn(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal):
        return exact_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               causal=causal, dtype=dtype)

    attn.__name__ = f"exact-{str(dtype).removeprefix('torch.')}"
    return attn


def recipe_label(recipe: "str | Recipe | Attention") -> str:
    """A short name for reports: the preset name, the Recipe's non-default fields, or the
    callable's name (a :class:`ForwardOnly` callable's: the wrapped one's)."""
    if isinstance(recipe, ForwardOnly):
        return recipe_label(recipe.attn)
    if isinstance(recipe, str):
        return recipe
    if isinstance(recipe, Recipe):
        default = Recipe(recipe.name)
        changed = [f"{f.name}={getattr(recipe, f.name)}" for f in fields(recipe)
                   if getattr(recipe, f.name) != getattr(default, f.name)]
        return recipe.name + (f"({', '.join(changed)})" if changed else "")
    return getattr(recipe, "__name__", type(recipe).__name__)
