"""The public attention functions: validate -> resolve the recipe, scale and backend once ->
one ``AttnSpec`` -> the custom ops of ``flamia/ops.py``.

Backends: "triton" (``flamia.kernels``, CUDA, the plain mxfp8, nvfp4, fp4 and bf16 recipes) and "reference"
(``flamia.reference.emulated``, the tile-faithful emulator of every recipe, CPU or GPU).
"""
import math

import torch

from . import ops
from .recipes import Recipe, resolve_recipe
from .spec import AttnSpec
from .validation import check_batched, check_head_dim, check_qkv, check_varlen, resolve_backend, resolve_seed


def flash_attn_varlen_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                           max_seqlen_q: int, max_seqlen_k: int, causal: bool = False,
                           softmax_scale: float | None = None, window_size: tuple[int, int] = (-1, -1),
                           recipe: "str | Recipe" = "mxfp8", backend: str | None = None,
                           return_lse: bool = False, *, validate_values: bool | None = None,
                           seed: int | None = None):
    """Low-precision attention on packed documents, differentiable.

    q: [Tq, Hq, D]; k, v: [Tk, Hkv, D]; bf16, fp16 or fp32, one dtype, one device, head dim
    contiguous; Hq a multiple of Hkv (query head h reads KV head h // (Hq // Hkv)).
    cu_seqlens_q/k: int32 [num_docs + 1] on q's device, document starts then the total.
    max_seqlen_q/k: the longest document (host ints, so no synchronisation is needed).
    causal and window_size = (left, right) (-1 unbounded) align bottom-right per document, as
    in FlashAttention; softmax_scale defaults to 1/sqrt(D). recipe: a name of
    ``flamia.RECIPES`` or a ``flamia.Recipe``. backend: None picks "triton" for the plain
    mxfp8, nvfp4, fp4 and bf16 recipes on CUDA and "reference" otherwise. validate_values: read cu_seqlens to check
    their values; None = only when they are on the CPU (on CUDA the read would synchronise)
    and the call is not being compiled (a value read would break the graph).
    seed: the random bits of a recipe that rounds stochastically (fp4's G, NUMERICS.md 6), an
    int in [0, 2^63); None draws one from torch's default CPU generator (pass one under
    torch.compile). Other recipes ignore it.
    Returns out [Tq, Hq, D] in q's dtype, and lse [Hq, Tq] fp32 (natural log, +inf for rows
    that see no key) when return_lse.
    """
    check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                 softmax_scale, window_size, return_lse, validate_values)
    recipe = resolve_recipe(recipe)
    backend = resolve_backend(backend, recipe, q)
    head_dim = q.shape[-1]
    check_head_dim(head_dim, backend, recipe)
    scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else float(softmax_scale)
    spec = AttnSpec(cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), causal, scale,
                    tuple(int(w) for w in window_size), recipe, resolve_seed(seed, recipe))
    out, lse = ops.attention(q, k, v, spec, backend)
    return (out, lse) if return_lse else out


def flash_attn_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    softmax_scale: float | None = None, window_size: tuple[int, int] = (-1, -1),
                    recipe: "str | Recipe" = "mxfp8", backend: str | None = None,
                    return_lse: bool = False, *, seed: int | None = None):
    """Batched attention: q [B, Sq, Hq, D], k and v [B, Sk, Hkv, D], one document per batch
    entry (causal aligned bottom-right when Sq != Sk). Arguments as flash_attn_varlen_func.
    Returns out [B, Sq, Hq, D] in q's dtype, and lse [B, Hq, Sq] fp32 when return_lse.
    """
    check_qkv(q, k, v, ndim=4)
    check_batched(q, k)
    batch, seq_q, heads_q, head_dim = q.shape
    seq_k = k.shape[1]
    steps = torch.arange(batch + 1, dtype=torch.int32, device=q.device)
    # The cu_seqlens built here are right by construction: no need to read them back.
    result = flash_attn_varlen_func(
        q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1),
        steps * seq_q, steps * seq_k, seq_q, seq_k, causal, softmax_scale, window_size,
        recipe, backend, return_lse, validate_values=False, seed=seed)
    if not return_lse:
        return result.reshape(batch, seq_q, heads_q, head_dim)
    out, lse = result
    return out.reshape(batch, seq_q, heads_q, head_dim), lse.reshape(heads_q, batch, seq_q).transpose(0, 1)
