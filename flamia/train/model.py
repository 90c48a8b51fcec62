"""The byte-level GPT and the attention it calls on packed rows.

Attention functions take q, k, v [tokens, heads, head_dim] of a packed ``Batch`` (tokens =
rows * context) and return the output of the same shape and dtype, causal within each
document: flamia's ``flash_attn_varlen_func`` over ``cu_seqlens``, or PyTorch SDPA with a
block-diagonal causal mask (the BF16 baseline, and in fp32 the exact yardstick).
"""
import math
from dataclasses import asdict
from typing import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import flamia
from flamia.data import Batch
from flamia.recipes import Recipe
from flamia.validation import check_head_dim, resolve_backend

from .config import RunSpec, SettingError, TrainConfig

AttnFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Batch], torch.Tensor]


# ---------------------------------------------------------------------------------------------
# Attention on packed rows
# ---------------------------------------------------------------------------------------------

def sdpa_attention(q, k, v, batch: Batch, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Causal attention within documents through SDPA with a block-diagonal mask, computed
    in ``dtype`` (None: the inputs' dtype). Returns the inputs' dtype."""
    rows, t = batch.doc.shape
    causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    mask = (batch.doc[:, :, None] == batch.doc[:, None, :]) & causal  # [rows, t, t]

    def heads(x):  # [rows * t, H, D] -> [rows, H, t, D]
        return x.to(dtype or x.dtype).view(rows, t, *x.shape[1:]).transpose(1, 2)

    # Autocast would recast the operands; the dtype is chosen here.
    with torch.autocast(q.device.type, enabled=False):
        out = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), attn_mask=mask[:, None])
    return out.transpose(1, 2).reshape(q.shape).to(q.dtype)


def exact_attention(q, k, v, batch: Batch) -> torch.Tensor:
    """The yardstick of every run: SDPA in fp32 with the same document mask."""
    return sdpa_attention(q, k, v, batch, dtype=torch.float32)


def flamia_attention(recipe: Recipe, backend: str | None) -> AttnFn:
    """flamia's varlen attention with ``recipe`` on ``backend`` (None: the API's choice)."""
    # Under --compile the rest of the model is compiled; the flamia call stays as it is
    # (its document count and lengths change with every batch).
    @torch.compiler.disable
    def attend(q, k, v, batch: Batch) -> torch.Tensor:
        return flamia.flash_attn_varlen_func(q, k, v, batch.cu_seqlens, batch.cu_seqlens, batch.max_seqlen,
                                             batch.max_seqlen, causal=True, recipe=recipe, backend=backend)
    return attend


def own_attention(spec: RunSpec, cfg: TrainConfig) -> AttnFn:
    """The attention a run trains with."""
    return sdpa_attention if spec.attn == "sdpa" else flamia_attention(spec.recipe, cfg.backend)


def describe_attention(spec: RunSpec, cfg: TrainConfig, device: torch.device) -> dict:
    """What the run's attention is, with the flamia backend the API resolves to; raises
    SettingError when that backend cannot run the recipe on ``device`` or the head dim."""
    exact = "sdpa float32, same document mask"
    if spec.attn == "sdpa":
        return {"attn": "sdpa", "dtype": "bfloat16", "recipe": None, "backend": None, "exact": exact}
    try:
        backend = resolve_backend(cfg.backend, spec.recipe, torch.empty(0, device=device))
    except ValueError as exc:
        raise SettingError(f"--backend: {str(exc).removeprefix('backend: ')}") from None
    try:
        check_head_dim(cfg.d_model // cfg.n_head, backend, spec.recipe)
    except ValueError as exc:
        raise SettingError(f"--d-model / --n-head: {cfg.d_model} / {cfg.n_head} = head dim "
                           f"{cfg.d_model // cfg.n_head}: {str(exc).removeprefix('q: ')}") from None
    return {"attn": "flamia", "recipe": asdict(spec.recipe), "backend": backend, "exact": exact}


# ---------------------------------------------------------------------------------------------
# Model: pre-LN GPT over packed tokens [tokens, d_model], positions counted per document
# ---------------------------------------------------------------------------------------------

class Block(nn.Module):
    def __init__(self, cfg: TrainConfig):
        super().__init__()
        d = cfg.d_model
        self.n_head = cfg.n_head
        self.ln1, self.ln2 = nn.LayerNorm(d, bias=False), nn.LayerNorm(d, bias=False)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.fc = nn.Linear(d, 4 * d, bias=False)
        self.out = nn.Linear(4 * d, d, bias=False)

    def forward(self, x: torch.Tensor, batch: Batch, attn: AttnFn) -> torch.Tensor:
        """x [tokens, d_model] -> the same shape."""
        q, k, v = self.qkv(self.ln1(x)).view(x.shape[0], 3, self.n_head, -1).unbind(1)
        x = x + self.proj(attn(q, k, v, batch).flatten(1))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, cfg: TrainConfig):
        super().__init__()
        self.wte = nn.Embedding(256, cfg.d_model)
        self.wpe = nn.Embedding(cfg.context, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model, bias=False)
        self.lm_head = nn.Linear(cfg.d_model, 256, bias=False)
        self.lm_head.weight = self.wte.weight
        for name, p in self.named_parameters():
            if p.dim() == 2:
                # GPT-2: residual projections shrink with depth so the residual stream does not grow.
                residual = name.endswith(("proj.weight", "out.weight"))
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.n_layer) if residual else 0.02)
        # Parameters that cost 6 FLOPs per token in training (positions are a lookup).
        self.flop_params = sum(p.numel() for p in self.parameters()) - self.wpe.weight.numel()

    def forward(self, batch: Batch, attn: AttnFn) -> torch.Tensor:
        """Logits [tokens, 256] of the packed batch (tokens = rows * context)."""
        x = self.wte(batch.x.reshape(-1)) + self.wpe(batch.pos)
        for block in self.blocks:
            x = block(x, batch, attn)
        return self.lm_head(self.ln_f(x))

    def flops_per_step(self, cfg: TrainConfig, batch: Batch) -> float:
        """Training FLOPs of one step: 6 per parameter and token, plus causal attention
        within documents (QK^T and PV: 4 FLOPs per pair and channel, x3 with the backward)."""
        lengths = batch.doc_lengths.astype(np.float64)
        pairs = float((lengths * (lengths + 1) / 2).sum())
        return 6.0 * self.flop_params * batch.tokens + 12.0 * cfg.n_layer * cfg.d_model * pairs


def loss_of(model, batch: Batch, attn: AttnFn) -> torch.Tensor:
    """Mean next-byte cross-entropy (nats per byte, fp32 scalar) under bf16 autocast."""
    with torch.autocast(batch.x.device.type, dtype=torch.bfloat16):
        logits = model(batch, attn)
    return F.cross_entropy(logits.float(), batch.y.reshape(-1))
