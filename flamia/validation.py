"""Input checks of the public API. Every error a user can trigger starts with the argument's
name (``"cu_seqlens_q: ..."``).

The checks never synchronise with the GPU: shapes, dtypes and devices are host metadata, and
the *values* of ``cu_seqlens`` are read only when ``validate_values`` is set. It defaults to
True for CPU tensors (reading them is free) and False for CUDA tensors (reading them would
stall the stream); pass True to check CUDA inputs while debugging.
"""
import math
import numbers
import warnings

import torch

from .kernels.configs import ROUTES, SUPPORTED_HEAD_DIMS, TILES
from .recipes import Recipe

INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
BACKENDS = ("triton", "reference")
REFERENCE_MAX_HEAD_DIM = 256
KERNEL_RECIPES = tuple(ROUTES)


def _is_int(x) -> bool:
    # type() first: isinstance against the numbers ABCs costs a microsecond per call
    return type(x) is int or (isinstance(x, numbers.Integral) and not isinstance(x, bool))


def _check_tensor(name: str, x, ndim: int, layout: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dim() != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D tensor {layout}, got shape {tuple(x.shape)}")
    if x.dtype not in INPUT_DTYPES:
        raise ValueError(f"{name}: dtype must be one of {INPUT_DTYPES}, got {x.dtype}")
    if x.stride(-1) != 1:
        raise ValueError(f"{name}: the head dim (last axis) must be contiguous, stride 1, got strides "
                         f"{x.stride()}; pass {name}.contiguous()")


def check_qkv(q, k, v, ndim: int) -> None:
    """q: [..., Hq, D], k and v: [..., Hkv, D] with ``ndim`` axes (3 packed, 4 batched); the
    leading axes of k and v agree, no axis is empty, Hq is a multiple of Hkv, one dtype and
    one device."""
    layout = "(total_tokens, heads, head_dim)" if ndim == 3 else "(batch, seqlen, heads, head_dim)"
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, x, ndim, layout)
    for name, x in (("k", k), ("v", v)):
        if x.dtype != q.dtype:
            raise ValueError(f"{name}: dtype {x.dtype} differs from q's {q.dtype}")
        if x.device != q.device:
            raise ValueError(f"{name}: on {x.device} but q is on {q.device}")
        if x.shape[-1] != q.shape[-1]:
            raise ValueError(f"{name}: head_dim {x.shape[-1]} differs from q's {q.shape[-1]}")
    if v.shape != k.shape:
        raise ValueError(f"v: shape {tuple(v.shape)} differs from k's {tuple(k.shape)} "
                         "(same tokens and heads expected)")
    for name, x in (("q", q), ("k", k)):
        if 0 in x.shape:
            raise ValueError(f"{name}: every axis must be non-empty, got shape {tuple(x.shape)}")
    if q.shape[-2] % k.shape[-2]:
        raise ValueError(f"k: q's {q.shape[-2]} heads are not a multiple of k's {k.shape[-2]} heads")


def check_batched(q: torch.Tensor, k: torch.Tensor) -> None:
    """Batched inputs (after check_qkv): one batch size for q and k."""
    if k.shape[0] != q.shape[0]:
        raise ValueError(f"k: batch size {k.shape[0]} differs from q's {q.shape[0]}")


def _check_cu_seqlens(name: str, cu, q: torch.Tensor) -> None:
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(cu).__name__}")
    if cu.dtype != torch.int32:
        raise ValueError(f"{name}: dtype must be torch.int32, got {cu.dtype}")
    if cu.dim() != 1 or cu.numel() < 2:
        raise ValueError(f"{name}: expected a 1-D tensor [num_docs + 1] with at least 2 entries, "
                         f"got shape {tuple(cu.shape)}")
    if cu.device != q.device:
        raise ValueError(f"{name}: on {cu.device} but q is on {q.device}")


def _check_cu_values(name: str, cu: torch.Tensor, total: int, max_name: str, max_seqlen: int) -> None:
    """Reads the values (a host copy): only call where that cannot stall a GPU stream."""
    starts = cu.tolist()
    if starts[0] != 0:
        raise ValueError(f"{name}: first entry must be 0, got {starts[0]}")
    lengths = [b - a for a, b in zip(starts, starts[1:])]
    if min(lengths) < 0:
        at = min(range(len(lengths)), key=lengths.__getitem__)
        raise ValueError(f"{name}: must be non-decreasing, but entry {at + 1} ({starts[at + 1]}) "
                         f"< entry {at} ({starts[at]})")
    if starts[-1] != total:
        raise ValueError(f"{name}: last entry {starts[-1]} must equal the number of packed tokens {total}")
    if max(lengths) > max_seqlen:
        raise ValueError(f"{max_name}: {max_seqlen} is smaller than the longest document ({max(lengths)})")


def _check_scalars(max_seqlen_q, max_seqlen_k, causal, softmax_scale, window_size, return_lse) -> None:
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if not _is_int(value):
            raise TypeError(f"{name}: expected a positive int, got {type(value).__name__}")
        if value <= 0:
            raise ValueError(f"{name}: expected a positive int, got {value}")
    for name, value in (("causal", causal), ("return_lse", return_lse)):
        if not isinstance(value, bool):
            raise TypeError(f"{name}: expected a bool, got {type(value).__name__}")
    if softmax_scale is not None:
        if not isinstance(softmax_scale, numbers.Real) or isinstance(softmax_scale, bool):
            raise TypeError(f"softmax_scale: expected None or a number, got {type(softmax_scale).__name__}")
        if not (math.isfinite(softmax_scale) and softmax_scale > 0):
            raise ValueError(f"softmax_scale: expected a positive finite number, got {softmax_scale!r}")
    if not (isinstance(window_size, (tuple, list)) and len(window_size) == 2
            and all(_is_int(w) and w >= -1 for w in window_size)):
        raise ValueError(f"window_size: expected a pair (left, right) of ints >= -1 (-1 = unbounded), "
                         f"got {window_size!r}")


def check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                 softmax_scale, window_size, return_lse, validate_values) -> None:
    """All arguments of flash_attn_varlen_func except recipe and backend (see module doc)."""
    check_qkv(q, k, v, ndim=3)
    _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q)
    _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, q)
    if cu_seqlens_k.numel() != cu_seqlens_q.numel():
        raise ValueError(f"cu_seqlens_k: {cu_seqlens_k.numel()} entries but cu_seqlens_q has "
                         f"{cu_seqlens_q.numel()}: both need one per document plus one")
    _check_scalars(max_seqlen_q, max_seqlen_k, causal, softmax_scale, window_size, return_lse)
    if validate_values is not None and not isinstance(validate_values, bool):
        raise TypeError(f"validate_values: expected None or a bool, got {type(validate_values).__name__}")
    if validate_values is None:
        validate_values = cu_seqlens_q.device.type == "cpu" and not torch.compiler.is_compiling()
    if validate_values:
        _check_cu_values("cu_seqlens_q", cu_seqlens_q, q.shape[0], "max_seqlen_q", max_seqlen_q)
        _check_cu_values("cu_seqlens_k", cu_seqlens_k, k.shape[0], "max_seqlen_k", max_seqlen_k)


def resolve_seed(seed, recipe: Recipe) -> int:
    """The call's seed for its random bits: 0 for a recipe that draws none; else ``seed`` (an
    int in [0, 2^63)), or when None one drawn from torch's default CPU generator, so that
    ``torch.manual_seed`` reproduces a run (no GPU synchronisation)."""
    if seed is not None and not (_is_int(seed) and 0 <= seed < 1 << 63):
        raise ValueError(f"seed: expected None or an int in [0, 2^63), got {seed!r}")
    if not recipe.rounds_grad_stochastically:
        return 0
    # Not asked while torch.compile traces: dynamo cannot branch on the query (it is not a
    # tensor), and a compiled call's graphs are captured later, where no Python runs.
    if not torch.compiler.is_compiling() and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        warnings.warn(f"seed: recipe {recipe.name!r} rounds stochastically and this call is being captured in a CUDA "
                      "graph, which replays the random bits of its capture on every replay (NUMERICS.md 6)",
                      stacklevel=3)
    if seed is None:
        if torch.compiler.is_compiling():
            raise ValueError(f"seed: recipe {recipe.name!r} rounds stochastically; under torch.compile pass an "
                             "int seed drawn outside the compiled function (a draw inside would be frozen)")
        return int(torch.randint(0, 1 << 62, (), dtype=torch.int64))
    return int(seed)


def _kernel_recipe(recipe: Recipe) -> str | None:
    """Why the triton backend cannot run ``recipe``, or None when it can (the plain mxfp8,
    nvfp4, fp4 and bf16 recipes, their bf16_scores, and nvfp4's 4-bit P options)."""
    if recipe.name not in KERNEL_RECIPES:
        return f"'triton' runs the {KERNEL_RECIPES} recipes, got {recipe.name!r}"
    if recipe.name == "fp4" and recipe.is_ablation:
        return "'triton' runs no ablation of the fp4 recipe"
    if recipe.is_ablation:
        # the forward's exponential and the mixed route's 4-bit P ablations are flags of the
        # kernels; per-tensor scales and unchecked saturation change the quantizers, which only
        # the emulator does, as it does the leaking groups' scales under the approximate exp2
        # and bf16's (whose inexact score sums move its 7-bit fixed point across roundings)
        p4_flags = dict(fwd_p4_bwd_p8=False, fwd_diag_block_m=None, p4_scale_before_mask=False)
        if (recipe.per_tensor_scales or not recipe.check_saturation
                or (recipe.name != "nvfp4" and recipe.with_(**p4_flags) != recipe)
                or (recipe.fwd_approx_exp and (recipe.p4_scale_before_mask or recipe.name == "bf16"))):
            return ("'triton' runs no ablation recipe but fwd_approx_exp (mxfp8, nvfp4) and nvfp4's fwd_p4_bwd_p8, "
                    "fwd_diag_block_m and p4_scale_before_mask")
        tiles_m = sorted({t.fwd_block_m for t in TILES.values()})
        if recipe.fwd_diag_block_m is not None and any(recipe.fwd_diag_block_m % m for m in tiles_m):
            return f"'triton' needs fwd_diag_block_m to be a multiple of its query tiles {tiles_m}"
    if recipe.name == "bf16" and recipe.hadamard:
        return "'triton' runs the bf16 recipe without the Hadamard rotation"
    return None


def resolve_backend(backend, recipe: Recipe, q: torch.Tensor) -> str:
    """None -> "triton" for a recipe the kernels run (``_kernel_recipe``) on CUDA, else
    "reference" (the emulator); an explicit "triton" must be runnable: CUDA tensors and such a
    recipe."""
    if backend is None:
        kernels = q.is_cuda and _kernel_recipe(recipe) is None
        return "triton" if kernels else "reference"
    if not isinstance(backend, str):
        raise TypeError(f"backend: expected None or a name, got {type(backend).__name__}")
    if backend not in BACKENDS:
        raise ValueError(f"backend: unknown backend {backend!r}; choose one of {BACKENDS} or None")
    if backend == "triton":
        why = _kernel_recipe(recipe)
        if why is not None:
            raise ValueError(f"backend: {why}; use backend='reference'")
        if not q.is_cuda:
            raise ValueError(f"backend: 'triton' needs CUDA tensors, q is on {q.device}; "
                             "use backend='reference' (the emulator) on the CPU")
    return backend


def check_head_dim(head_dim: int, backend: str, recipe: Recipe) -> None:
    """The backend's head dims; Recipe.use_hadamard raises (naming ``recipe``) when the
    recipe asks for a Hadamard rotation the head dim has no matrix for."""
    if backend == "triton" and head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"q: head_dim {head_dim} is not supported by the triton backend "
                         f"{SUPPORTED_HEAD_DIMS}; backend='reference' runs any multiple of 16 up to 256")
    if backend == "reference" and (head_dim % 16 or not 0 < head_dim <= REFERENCE_MAX_HEAD_DIM):
        raise ValueError(f"q: head_dim must be a multiple of 16 up to {REFERENCE_MAX_HEAD_DIM} "
                         f"for the reference backend, got {head_dim}")
    recipe.use_hadamard(head_dim)
