"""The attention call as two ``torch.library`` custom ops, ``flamia::attention_forward`` and
``flamia::attention_backward``, joined by ``register_autograd``.

torch.compile sees one opaque op per direction: Dynamo does not trace Triton's launcher, and
Inductor cannot wrap the Gluon kernels. Each op takes the call's ``AttnSpec`` flattened into
the types an op schema allows (the recipe as its ``Recipe.key``) and rebuilds it; fake
implementations give shapes and dtypes only. Eager calls hand the spec itself to the same
implementations through a plain autograd.Function (``_EagerAttention``), which costs less
host time.

Backends: "triton" (``kernels/ops.py``: the backward reads the forward's quantized operands)
and "reference" (the emulator, ``reference/emulated.py``: its backward recomputes the
forward, bit for bit, instead of holding the emulator's state between the ops). A recipe fixes
its numerics: autocast is off inside the ops (the triton backend's eager path runs no op autocast
would change, and skips the switch).
"""
import functools

import torch
from torch import Tensor

from .recipes import Recipe
from .spec import AttnSpec


@functools.cache
def _kernel_ops():
    """flamia.kernels.ops, imported on the first triton call (it compiles nothing until then)."""
    from .kernels import ops
    return ops


@functools.lru_cache(maxsize=None)
def _recipe(key: str) -> Recipe:
    return Recipe.from_key(key)


def _flat(spec: AttnSpec) -> tuple:
    """The spec as the ops' arguments after the tensors (``_spec`` inverts it)."""
    return (spec.cu_seqlens_q, spec.cu_seqlens_k, spec.max_seqlen_q, spec.max_seqlen_k, spec.causal,
            spec.softmax_scale, list(spec.window_size), spec.recipe.key, spec.seed)


def _spec(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale, window_size,
          recipe, seed) -> AttnSpec:
    return AttnSpec(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale,
                    tuple(window_size), _recipe(recipe), seed)


def _emulate_forward(q, k, v, spec: AttnSpec):
    from .reference.emulated import emulate_forward
    return emulate_forward(q, k, v, spec.cu_seqlens_q, spec.cu_seqlens_k, spec.max_seqlen_q, spec.max_seqlen_k,
                           causal=spec.causal, softmax_scale=spec.softmax_scale, window_size=spec.window_size,
                           recipe=spec.recipe, seed=spec.seed)


def _forward(q, k, v, spec: AttnSpec, backend: str):
    """(out [Tq, Hq, D] in q's dtype, lse [Hq, Tq] fp32, what the backward reads: the triton
    backend's ``Residuals``, or q, k, v for the reference backend)."""
    with torch.autocast(q.device.type, enabled=False):
        if backend == "triton":
            ops = _kernel_ops()
            out, lse, res = ops.forward(q, k, v, spec)
            return out, lse, ops.residual_tensors(res, spec, q.dtype)  # the autograd node keeps Q and K
        fwd = _emulate_forward(q, k, v, spec)
        return fwd.out, fwd.lse, [q, k, v]


def _backward(dout, out, saved, spec: AttnSpec, backend: str):
    """dq [Tq, Hq, D], dk, dv [Tk, Hkv, D] in dout's dtype; saved: ``_forward``'s third output."""
    with torch.autocast(dout.device.type, enabled=False):
        if backend == "triton":
            ops = _kernel_ops()
            return ops.backward(dout, out, ops.split_saved(saved, spec, out.dtype), spec)
        from .reference.emulated import emulate_backward
        q, k, v = saved
        dq, dk, dv = emulate_backward(_emulate_forward(q, k, v, spec), dout.contiguous())
        return dq.to(dout.dtype), dk.to(dout.dtype), dv.to(dout.dtype)


@torch.library.custom_op("flamia::attention_forward", mutates_args=())
def attention_forward(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                      max_seqlen_q: int, max_seqlen_k: int, causal: bool, softmax_scale: float,
                      window_size: list[int], recipe: str, seed: int, backend: str) -> tuple[Tensor, Tensor, list[Tensor]]:
    """``_forward`` as an op. Its outputs may not alias its inputs or each other, so what
    does leaves as a copy: the reference backend's q, k, v, and the triton backend's key-side
    document starts when both sides share cu_seqlens."""
    spec = _spec(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale, window_size, recipe,
                 seed)
    out, lse, saved = _forward(q, k, v, spec, backend)
    seen = {id(x) for x in (q, k, v, cu_seqlens_q, cu_seqlens_k)}
    unique = []
    for x in saved:
        unique.append(x.clone() if id(x) in seen else x)
        seen.add(id(x))
    return out, lse, unique


@attention_forward.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale, window_size, recipe,
      seed, backend):
    lse = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
    if backend == "triton":
        from .kernels.ops import empty_residuals
        spec = _spec(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale, window_size,
                     recipe, seed)
        return torch.empty_like(q), lse, empty_residuals(q, k, spec).tensors()
    return torch.empty_like(q), lse, [torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)]


@torch.library.custom_op("flamia::attention_backward", mutates_args=())
def attention_backward(dout: Tensor, out: Tensor, saved: list[Tensor], cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                       max_seqlen_q: int, max_seqlen_k: int, causal: bool, softmax_scale: float,
                       window_size: list[int], recipe: str, seed: int, backend: str) -> tuple[Tensor, Tensor, Tensor]:
    """``_backward`` as an op."""
    spec = _spec(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale, window_size, recipe,
                 seed)
    return _backward(dout, out, saved, spec, backend)


@attention_backward.register_fake
def _(dout, out, saved, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale, window_size,
      recipe, seed, backend):
    if backend == "triton":
        spec = _spec(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale, window_size,
                     recipe, seed)
        k = _kernel_ops().split_saved(saved, spec, out.dtype).k_codes  # [Tk, Hkv, D]
    else:
        k = saved[1]  # K: [Tk, Hkv, D]
    return (torch.empty_like(dout), dout.new_empty(k.shape), dout.new_empty(k.shape))


_CALL_ARGS = ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k", "causal", "softmax_scale",
              "window_size", "recipe", "seed", "backend")


def _setup_context(ctx, inputs, output):
    out, lse, saved = output
    ctx.call = inputs[3:]
    q, k, backend = inputs[0], inputs[1], inputs[12]
    # Q and K where the triton backend's residuals leave them out (their own codes)
    own = _kernel_ops().own_inputs(q, k, _spec(*inputs[3:12])) if backend == "triton" else []
    ctx.save_for_backward(out, *saved, *own)
    ctx.mark_non_differentiable(lse, *saved)
    ctx.set_materialize_grads(False)  # no zero gradients for lse and the residuals


def _op_backward(ctx, dout, _dlse, _dsaved):
    out, *saved = ctx.saved_tensors
    dq, dk, dv = attention_backward(dout, out, saved, *ctx.call)
    return (dq, dk, dv) + (None,) * len(_CALL_ARGS)


attention_forward.register_autograd(_op_backward, setup_context=_setup_context)


class _EagerAttention(torch.autograd.Function):
    """The ops' implementations without torch.library's dispatch, for calls outside
    torch.compile: its wrappers cost more host time than the launches themselves
    (docs/PERFORMANCE.md, host time). The triton backend replays each shape's recorded launches
    (``kernels/replay.py``). Same functions, same bits."""

    @staticmethod
    def forward(ctx, q, k, v, spec: AttnSpec, backend: str):
        ctx.spec, ctx.backend, ctx.program = spec, backend, None
        if backend == "triton":  # its launches run no op that autocast would change
            out, lse, saved, ctx.program = _kernel_ops().forward_eager(q, k, v, spec)
        else:
            out, lse, saved = _forward(q, k, v, spec, backend)
        ctx.save_for_backward(out, *saved)
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        out, *saved = ctx.saved_tensors
        if ctx.backend == "triton":
            grads = _kernel_ops().backward_eager(dout, out, saved, ctx.spec, ctx.program)
        else:
            grads = _backward(dout, out, saved, ctx.spec, ctx.backend)
        return (*grads, None, None)


def attention(q: Tensor, k: Tensor, v: Tensor, spec: AttnSpec, backend: str) -> tuple[Tensor, Tensor]:
    """out [Tq, Hq, D] in q's dtype and lse [Hq, Tq] fp32 (not differentiable); spec is
    resolved (``AttnSpec``), backend "triton" or "reference". Under torch.compile the custom
    ops, else ``_EagerAttention``."""
    if torch.compiler.is_compiling():
        out, lse, _ = attention_forward(q, k, v, *_flat(spec), backend)
        return out, lse
    return _EagerAttention.apply(q, k, v, spec, backend)
