"""Attention over packed documents as ``torch.nn`` modules, for models written by hand.

    import flamia.nn

    attn = flamia.nn.DocumentAttention(recipe="mxfp8", causal=True)
    cu_seqlens, max_seqlen = flamia.nn.cu_seqlens_from_position_ids(position_ids)  # once per batch
    out = attn(q, k, v, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen)              # in every layer

Layouts are FlashAttention's: packed q [T, Hq, D] with k, v [T, Hkv, D], or batched
q [B, S, Hq, D] with k, v [B, S, Hkv, D] (GQA when Hkv < Hq). ``SelfAttention`` adds the
query/key/value and output projections around ``DocumentAttention``.
"""
import torch
from torch import nn

from .api import flash_attn_func, flash_attn_varlen_func
from .recipes import Recipe, resolve_recipe


def cu_seqlens_from_position_ids(position_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Document boundaries of packed rows from their position ids.

    position_ids: integer tensor [T] (one row) or [B, S] (B rows, flattened row after row).
    A document starts at the first token of every row and wherever a position is not its
    predecessor's plus one: positions restarting at 0, as ``DataCollatorWithFlattening``
    writes them, or any other jump (the rule of transformers' own packed-sequence masks).
    Returns cu_seqlens int32 [num_docs + 1] on position_ids' device (document starts, then
    the token count) and max_seqlen, the longest document, a host int: on CUDA this reads
    the device (a synchronisation), so derive them once per batch, not once per layer.
    """
    if not isinstance(position_ids, torch.Tensor):
        raise TypeError(f"position_ids: expected a torch.Tensor, got {type(position_ids).__name__}")
    if position_ids.is_floating_point() or position_ids.is_complex() or position_ids.dtype == torch.bool:
        raise ValueError(f"position_ids: expected an integer dtype, got {position_ids.dtype}")
    if position_ids.dim() not in (1, 2) or position_ids.numel() == 0:
        raise ValueError(f"position_ids: expected a non-empty [T] or [B, S] tensor, got shape "
                         f"{tuple(position_ids.shape)}")
    rows = position_ids.reshape(1, -1) if position_ids.dim() == 1 else position_ids
    starts = torch.ones(rows.shape, dtype=torch.bool, device=rows.device)
    starts[:, 1:] = rows[:, 1:] != rows[:, :-1] + 1
    first = starts.flatten().nonzero().flatten()
    cu_seqlens = torch.cat((first, first.new_tensor([rows.numel()]))).to(torch.int32)
    return cu_seqlens, int(cu_seqlens.diff().max())


def _one_dtype(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """Under autocast, q, k and v in the autocast dtype (rotary embeddings in fp32 promote q
    and k); otherwise unchanged."""
    device_type = q.device.type
    if not torch.is_autocast_enabled(device_type):
        return q, k, v
    dtype = torch.get_autocast_dtype(device_type)
    return tuple(x.to(dtype) if isinstance(x, torch.Tensor) else x for x in (q, k, v))


class DocumentAttention(nn.Module):
    """Attention that never crosses a document boundary, through ``flamia.flash_attn_varlen_func``.

    recipe: a name of ``flamia.RECIPES`` or a ``flamia.Recipe``. causal, softmax_scale
    (None: 1/sqrt(D)), window_size = (left, right) (-1 unbounded) and backend (None: "triton"
    for mxfp8, nvfp4, fp4 and bf16 on CUDA, the "reference" emulator otherwise) as in ``flash_attn_varlen_func``.
    No parameters.
    """

    def __init__(self, recipe: "str | Recipe" = "mxfp8", causal: bool = True,
                 softmax_scale: float | None = None, window_size: tuple[int, int] = (-1, -1),
                 backend: str | None = None):
        super().__init__()
        self.recipe = resolve_recipe(recipe)
        self.causal = causal
        self.softmax_scale = softmax_scale
        self.window_size = window_size
        self.backend = backend

    def extra_repr(self) -> str:
        return (f"recipe={self.recipe.name!r}, causal={self.causal}, softmax_scale={self.softmax_scale}, "
                f"window_size={self.window_size}, backend={self.backend!r}")

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                cu_seqlens: torch.Tensor | None = None, max_seqlen: int | None = None,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """q: packed [T, Hq, D] or batched [B, S, Hq, D]; k, v: [T, Hkv, D] or [B, S, Hkv, D];
        bf16, fp16 or fp32 (under autocast all three are cast to the autocast dtype).

        Documents come from one of: cu_seqlens (int32 [num_docs + 1] over the T, or B * S
        flattened, tokens) with max_seqlen (host int; None reads it from cu_seqlens, a
        synchronisation on CUDA); position_ids ([T] or [B, S], see
        ``cu_seqlens_from_position_ids``; derived again at every call); or, for batched
        input only, neither: every row is one document.
        Returns out with q's shape, in q's dtype (the autocast dtype under autocast).
        """
        if not isinstance(q, torch.Tensor):
            raise TypeError(f"q: expected a torch.Tensor, got {type(q).__name__}")
        if q.dim() not in (3, 4):
            raise ValueError(f"q: expected packed [T, H, D] or batched [B, S, H, D], got shape {tuple(q.shape)}")
        if position_ids is not None and cu_seqlens is not None:
            raise ValueError("position_ids: pass either cu_seqlens or position_ids, not both")
        if max_seqlen is not None and cu_seqlens is None:
            raise ValueError("max_seqlen: given without cu_seqlens")
        if cu_seqlens is None and position_ids is None and q.dim() == 3:
            raise ValueError("cu_seqlens: packed q [T, H, D] needs cu_seqlens or position_ids to know "
                             "where its documents start")
        if position_ids is not None:
            if isinstance(position_ids, torch.Tensor) and position_ids.numel() != q.shape[:-2].numel():
                raise ValueError(f"position_ids: {position_ids.numel()} positions for q's "
                                 f"{q.shape[:-2].numel()} tokens")
            cu_seqlens, max_seqlen = cu_seqlens_from_position_ids(position_ids)
        elif cu_seqlens is not None:
            _check_cu_seqlens(cu_seqlens, max_seqlen)
            if max_seqlen is None:
                max_seqlen = int(cu_seqlens.diff().max())
        if cu_seqlens is not None and q.dim() == 4 and isinstance(k, torch.Tensor) and k.dim() == 4 \
                and k.shape[1] != q.shape[1]:
            raise ValueError(f"k: {k.shape[1]} tokens per row but q has {q.shape[1]}: documents given by "
                             "cu_seqlens or position_ids need rows of one length")
        q, k, v = _one_dtype(q, k, v)
        args = dict(causal=self.causal, softmax_scale=self.softmax_scale, window_size=self.window_size,
                    recipe=self.recipe, backend=self.backend)
        if cu_seqlens is None:
            return flash_attn_func(q, k, v, **args)
        out = flash_attn_varlen_func(_packed(q), _packed(k), _packed(v), cu_seqlens, cu_seqlens,
                                     max_seqlen, max_seqlen, **args)
        return out.view(q.shape)


def _check_cu_seqlens(cu_seqlens, max_seqlen) -> None:
    """The module's names for what flash_attn_varlen_func checks as cu_seqlens_q and max_seqlen_q."""
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"cu_seqlens: expected a torch.Tensor, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dtype != torch.int32 or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens: expected int32 [num_docs + 1] (at least 2 entries), got "
                         f"{cu_seqlens.dtype} {tuple(cu_seqlens.shape)}")
    if max_seqlen is not None and (not isinstance(max_seqlen, int) or isinstance(max_seqlen, bool)
                                   or max_seqlen <= 0):
        raise ValueError(f"max_seqlen: expected None or a positive int, got {max_seqlen!r}")


def _packed(x):
    """[B, S, H, D] -> [B * S, H, D]; anything else unchanged (the API checks it)."""
    return x.flatten(0, 1) if isinstance(x, torch.Tensor) and x.dim() == 4 else x


class SelfAttention(nn.Module):
    """Multi-head self-attention over packed documents: projections around ``DocumentAttention``.

    d_model: model width; n_heads query heads of d_model // n_heads channels; n_kv_heads
    key/value heads (None: n_heads; fewer: grouped-query attention). bias: on the
    projections. The attention arguments are ``DocumentAttention``'s. Positions are the
    caller's: add position embeddings to x (the module has none).
    """

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int | None = None, bias: bool = False,
                 recipe: "str | Recipe" = "mxfp8", causal: bool = True, softmax_scale: float | None = None,
                 window_size: tuple[int, int] = (-1, -1), backend: str | None = None):
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if n_heads <= 0 or d_model % n_heads:
            raise ValueError(f"n_heads: must divide d_model {d_model}, got {n_heads}")
        if n_kv_heads <= 0 or n_heads % n_kv_heads:
            raise ValueError(f"n_kv_heads: must divide n_heads {n_heads}, got {n_kv_heads}")
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, d_model // n_heads
        self.qkv = nn.Linear(d_model, (n_heads + 2 * n_kv_heads) * self.head_dim, bias=bias)
        self.attention = DocumentAttention(recipe, causal, softmax_scale, window_size, backend)
        self.out = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor | None = None, max_seqlen: int | None = None,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """x: packed [T, d_model] or batched [B, S, d_model]; documents as in
        ``DocumentAttention.forward``. Returns x's shape."""
        heads = (self.n_heads, self.n_kv_heads, self.n_kv_heads)
        q, k, v = (t.unflatten(-1, (h, self.head_dim))
                   for t, h in zip(self.qkv(x).split([h * self.head_dim for h in heads], dim=-1), heads))
        return self.out(self.attention(q, k, v, cu_seqlens, max_seqlen, position_ids).flatten(-2))
