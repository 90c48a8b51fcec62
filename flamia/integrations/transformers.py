"""flamia as a Hugging Face transformers attention backend: ``attn_implementation="flamia"``.

    import flamia.integrations.transformers          # registers "flamia" (on import)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="flamia")
    model.config.flamia_recipe = "mxfp8"             # the default; a name of flamia.RECIPES or a flamia.Recipe
    model.config.flamia_backend = None               # None: triton for mxfp8, nvfp4, fp4 and bf16 on CUDA, else the emulator

Importing this module calls ``register()``, which registers ``flamia_attention_forward`` with
``transformers.AttentionInterface`` and transformers' flash-attention mask function with
``AttentionMaskInterface``, both under "flamia" (``register(name)`` adds another name). The
mask function matters: transformers builds no mask for a name its mask interface does not
know, so padded batches would silently attend to their padding. Like FlashAttention's,
it hands the attention a 2-D padding mask [B, S_k] (bool, True = real token), or None when
no token is padded.

The attention function finds the documents of its [B, S] tokens the way transformers'
FlashAttention integration does, first match wins:
1. ``attention_mask`` [B, S_k]: the real tokens of each row are one document (padding
   anywhere; with fewer queries than keys, as when decoding, the queries are the last S_q).
2. ``cu_seq_lens_q/k`` with ``max_length_q/k`` (``DataCollatorWithFlattening(
   return_flash_attn_kwargs=True)``): used as given, over the B * S flattened tokens.
3. ``position_ids`` [B, S] or [1, S], when S_q == S_k: ``flamia.nn.cu_seqlens_from_position_ids``
   (a document starts at every row and wherever a position is not its predecessor's plus
   one, e.g. restarts at 0: the rule of transformers' own packed-sequence masks).
4. Otherwise every row is one document.
The module's ``scaling``, ``is_causal`` (a call's ``is_causal`` wins) and ``sliding_window``
(a window of that many keys, the query's own included) are honoured; ``flamia_recipe`` and
``flamia_backend`` come from the call's kwargs, else from the config, else the defaults above.
"""
import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

from ..api import flash_attn_func, flash_attn_varlen_func
from ..nn import cu_seqlens_from_position_ids

DEFAULT_RECIPE = "mxfp8"


class _LastTensorCache:
    """``fn(tensor, *args)``, remembered for the last tensor and args seen.

    The boundaries of a forward are derived once, not once per layer: a model passes the
    same mask, position-ids and max-length tensors (the same Python objects) to all its
    layers, so a result is reused while the tensor is that object (held here, so its id
    cannot be reused) and its version counter is unchanged (an in-place write recomputes).
    Inference tensors have no version counter and are recomputed at every call.
    """

    def __init__(self, fn):
        self._fn = fn
        self._key = None
        self._value = None

    def __call__(self, tensor: torch.Tensor, *args):
        if tensor.is_inference():
            return self._fn(tensor, *args)
        key = (tensor, tensor._version, args)
        if self._key is None or self._key[0] is not tensor or self._key[1:] != key[1:]:
            self._value = self._fn(tensor, *args)
            self._key = key
        return self._value


def _unpadding(attention_mask: torch.Tensor, q_len: int):
    """attention_mask bool [B, S_k] -> (rows_q, rows_k: int64 indices of the real tokens of the
    flattened [B * S_q] queries and [B * S_k] keys; cu_q, cu_k int32 [B + 1]; max_q, max_k ints)."""
    def split(mask):
        lengths = mask.sum(-1, dtype=torch.int32)
        cu = torch.nn.functional.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))
        return mask.flatten().nonzero().flatten(), cu, int(lengths.max())
    rows_k, cu_k, max_k = split(attention_mask)
    rows_q, cu_q, max_q = split(attention_mask[:, -q_len:]) if q_len != attention_mask.shape[1] \
        else (rows_k, cu_k, max_k)
    return rows_q, rows_k, cu_q, cu_k, max_q, max_k


_unpadding_of = _LastTensorCache(_unpadding)
_cu_seqlens_of = _LastTensorCache(lambda position_ids, batch: cu_seqlens_from_position_ids(
    position_ids.expand(batch, -1)))
# DataCollatorWithFlattening's kwargs: cu_seq_lens may be int64, max_length a 0-d tensor.
_cu_q_of, _cu_k_of = (_LastTensorCache(lambda cu: cu.to(torch.int32)) for _ in range(2))
_max_q_of, _max_k_of = (_LastTensorCache(int) for _ in range(2))


def _host_int(x: "int | torch.Tensor", cache: _LastTensorCache) -> int:
    return x if isinstance(x, int) else cache(x)


def _setting(name: str, module: torch.nn.Module, kwargs: dict, default):
    """A call kwarg ``name``, else the module config's attribute, else ``default``."""
    if kwargs.get(name) is not None:
        return kwargs[name]
    value = getattr(getattr(module, "config", None), name, None)
    return default if value is None else value


def _target_dtype(query: torch.Tensor, value: torch.Tensor) -> torch.dtype:
    """One dtype for q, k and v: autocast's when it is on (rotary embeddings computed in fp32
    promote q and k while v stays in the autocast dtype), else v's."""
    device_type = query.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return value.dtype


def flamia_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                             value: torch.Tensor, attention_mask: torch.Tensor | None,
                             dropout: float = 0.0, scaling: float | None = None,
                             sliding_window: int | None = None, softcap: float | None = None,
                             is_causal: bool | None = None, s_aux: torch.Tensor | None = None,
                             position_ids: torch.Tensor | None = None,
                             cu_seq_lens_q: torch.Tensor | None = None, cu_seq_lens_k: torch.Tensor | None = None,
                             max_length_q: "int | torch.Tensor | None" = None,
                             max_length_k: "int | torch.Tensor | None" = None,
                             **kwargs) -> tuple[torch.Tensor, None]:
    """The attention function of ``AttentionInterface`` (see the module doc for the documents).

    query: [B, Hq, S_q, D]; key, value: [B, Hkv, S_k, D] (Hkv divides Hq; value's head dim
    may be smaller, it is zero-padded to D and cropped from the output). attention_mask: bool
    [B, S_k] or None, as the "flamia" mask function makes it. scaling: softmax scale (None:
    1/sqrt(D)). kwargs: ``flamia_recipe``, ``flamia_backend``; the rest (use_cache,
    output_attentions, ...) is ignored.
    Returns (out [B, S_q, Hq, D_v] in q, k and v's common dtype, None): flamia computes no
    attention weights. Dropout, softcap and attention sinks (s_aux) are refused.
    """
    if dropout:
        raise ValueError(f"dropout: flamia has no attention dropout, got {dropout}; set the config's "
                         "attention_dropout to 0")
    if softcap is not None:
        raise ValueError(f"softcap: flamia does not cap attention logits, got {softcap}")
    if s_aux is not None:
        raise ValueError("s_aux: flamia has no attention sinks")
    if attention_mask is not None and (attention_mask.dim() != 2 or attention_mask.dtype != torch.bool):
        raise ValueError(f"attention_mask: flamia takes the 2-D bool padding mask [batch, kv_len] of its "
                         f"registered mask function, got {attention_mask.dtype} {tuple(attention_mask.shape)}")
    causal = bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)
    window = (-1, -1) if sliding_window is None else (sliding_window - 1, 0 if causal else sliding_window - 1)
    args = dict(causal=causal, softmax_scale=scaling, window_size=window,
                recipe=_setting("flamia_recipe", module, kwargs, DEFAULT_RECIPE),
                backend=_setting("flamia_backend", module, kwargs, None))

    batch, _, q_len, head_dim = query.shape
    k_len, v_head_dim = key.shape[2], value.shape[-1]
    dtype = _target_dtype(query, value)
    q, k, v = (x.transpose(1, 2).to(dtype) for x in (query, key, value))  # [B, S, H, D]
    if v_head_dim != head_dim:
        v = torch.nn.functional.pad(v, (0, head_dim - v_head_dim))

    if attention_mask is not None:
        rows_q, rows_k, cu_q, cu_k, max_q, max_k = _unpadding_of(attention_mask, q_len)
        k, v = k[:, :attention_mask.shape[1]], v[:, :attention_mask.shape[1]]  # a static cache may be longer
        packed = flash_attn_varlen_func(q.flatten(0, 1)[rows_q], k.flatten(0, 1)[rows_k],
                                        v.flatten(0, 1)[rows_k], cu_q, cu_k, max_q, max_k, **args)
        out = packed.new_zeros(batch * q_len, *packed.shape[1:]).index_copy(0, rows_q, packed)
    elif cu_seq_lens_q is not None and max_length_q is not None:
        cu_q = _cu_q_of(cu_seq_lens_q)
        cu_k = cu_q if cu_seq_lens_k is None or cu_seq_lens_k is cu_seq_lens_q else _cu_k_of(cu_seq_lens_k)
        max_q = _host_int(max_length_q, _max_q_of)
        max_k = (max_q if max_length_k is None or max_length_k is max_length_q
                 else _host_int(max_length_k, _max_k_of))
        out = flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu_q, cu_k,
                                     max_q, max_k, **args)
    elif position_ids is not None and q_len == k_len and position_ids.shape[-1] == q_len:
        cu, max_len = _cu_seqlens_of(position_ids, batch)
        out = flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu, cu,
                                     max_len, max_len, **args)
    else:
        out = flash_attn_func(q, k, v, **args)
    return out.view(batch, q_len, *out.shape[-2:])[..., :v_head_dim], None


def register(name: str = "flamia") -> None:
    """Registers ``flamia_attention_forward`` and transformers' FlashAttention mask function
    under ``name``, so that ``attn_implementation=name`` selects flamia. Importing this module
    does it for "flamia"; calling it again is harmless."""
    AttentionInterface.register(name, flamia_attention_forward)
    AttentionMaskInterface.register(name, flash_attention_mask)


register()
