"""Byte-level GPT on packed documents: the paper's training experiment (Section 4.5).

Every run trains the same model with the same seed, data order and hyperparameters; only
the attention numerics differ (``RUNS``). Attention goes through ``flamia.flash_attn_varlen_func``
on packed documents (``cu_seqlens`` per row), or through PyTorch SDPA with a block-diagonal
causal mask for the BF16 baseline. At every evaluation a run records its validation loss
through its own attention and through exact attention (SDPA in fp32, same mask), the mean
gradient norm, and ``single_step_cos``: the cosine between its attention gradients
(dQ, dK, dV) and the exact ones on the first layer of a fixed validation batch.

    python -m flamia.train --run mxfp8 [--profile smoke|paper] [--steps 300 ...] [--resume]
    python -m flamia.train --report     # results table + curves from experiments/results/

Outputs: ``<results_dir>/<run>.json`` (config and one record per evaluation) and
``<ckpt_dir>/<run>.pt`` (resumable; ``--time-limit`` and ``--stop-at`` end a piece early).
"""
import argparse
import codecs
import json
import math
import os
import time
import typing
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import flamia
from flamia.data import Batch, PackedText, load_bytes, split
from flamia.recipes import Recipe
from flamia.validation import resolve_backend


# ---------------------------------------------------------------------------------------------
# Runs: one attention numerics each
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RunSpec:
    """attn: "sdpa" (PyTorch, BF16) or "flamia"; recipe: the flamia Recipe (flamia only)."""

    attn: str
    recipe: Recipe | None = None


RUNS = {
    "bf16": RunSpec("sdpa"),
    "mxfp8": RunSpec("flamia", Recipe("mxfp8")),
    "nvfp4": RunSpec("flamia", Recipe("nvfp4")),
    "fp4": RunSpec("flamia", Recipe("fp4")),
    # 4-bit P groups scaled before the causal mask: future keys leak into earlier rows.
    "leak": RunSpec("flamia", Recipe("nvfp4", p4_scale_before_mask=True)),
    "per_tensor": RunSpec("flamia", Recipe("mxfp8", per_tensor_scales=True)),
    # Forward/backward mismatches: P precision, diagonal tiling, exponential.
    "mm_prepr": RunSpec("flamia", Recipe("nvfp4", fwd_p4_bwd_p8=True)),
    "mm_diag": RunSpec("flamia", Recipe("nvfp4", fwd_diag_block_m=256)),
    "mm_exp": RunSpec("flamia", Recipe("mxfp8", fwd_approx_exp=True)),
}


def run_spec(cfg: "TrainConfig") -> RunSpec:
    """The run's attention, with ``p4_sum_quantized`` set on its recipe when the config asks
    for it and the recipe has 4-bit P (every nvfp4 and fp4 run, ablations included)."""
    spec = RUNS[cfg.run]
    if cfg.p4_sum_quantized and spec.recipe is not None and spec.recipe.has_p4:
        return RunSpec(spec.attn, spec.recipe.with_(p4_sum_quantized=True))
    return spec


# ---------------------------------------------------------------------------------------------
# Configuration: dataclass defaults are the paper profile
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TrainConfig:
    run: str = "bf16"
    profile: str = "paper"
    data: str = "data/english-text.txt"  # any file, read as bytes; .xz is decompressed
    doc_sep: str = r"\n\n"               # document separator, with Python escapes
    results_dir: str = "experiments/results"
    ckpt_dir: str = "experiments/checkpoints"
    backend: str | None = None           # flamia backend; None = the API's choice
    p4_sum_quantized: bool = False       # 4-bit P runs: l summed from the 4-bit P (NUMERICS.md 6)
    device: str = "auto"
    # model
    n_layer: int = 6
    d_model: int = 1024
    n_head: int = 16
    context: int = 1024
    # optimisation
    batch_size: int = 32                 # rows of `context` bytes per step
    steps: int = 6000
    warmup: int = 200
    lr: float = 6e-4
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    seed: int = 1337
    compile: bool = False
    # evaluation, logging, pieces
    eval_interval: int = 250
    eval_batches: int = 16               # validation batches of `batch_size` rows
    ckpt_interval: int = 500
    log_interval: int = 10
    peak_tflops: float = 989.0           # H200 dense BF16, the MFU denominator for every run
    time_limit: float | None = None      # seconds for this process, then checkpoint and exit
    stop_at: int | None = None           # checkpoint and exit after this step


PROFILES = {
    "paper": {},
    "smoke": dict(n_layer=4, d_model=256, n_head=4, batch_size=8, steps=400, warmup=40, lr=2e-3,
                  eval_interval=100, eval_batches=4, ckpt_interval=100),
    # The smoke model trained 2.5x longer: what 30 minutes of one session's device time allow
    # for the seven emulated runs (the emulator trains at 10-25k tokens/s on the H200).
    "small": dict(n_layer=4, d_model=256, n_head=4, batch_size=8, steps=1000, warmup=100, lr=2e-3,
                  eval_interval=100, eval_batches=4, ckpt_interval=100),
}
# The small profile with every 4-bit P run summing l from its 4-bit values: plain nvfp4 and
# fp4 diverged in `small`, and the leak and mismatch effects need a 4-bit baseline that trains.
PROFILES["small-sumq"] = {**PROFILES["small"], "p4_sum_quantized": True}

# Fields a resumed piece may change: they do not change what is trained.
PIECE_FIELDS = {"data", "results_dir", "ckpt_dir", "device", "compile", "log_interval",
                "peak_tflops", "time_limit", "stop_at"}


# ---------------------------------------------------------------------------------------------
# Attention on packed rows: q, k, v [tokens, heads, head_dim] -> out, same shape and dtype
# ---------------------------------------------------------------------------------------------

AttnFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Batch], torch.Tensor]


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
    # Under --compile the rest of the model is compiled; the flamia call stays as it is
    # (its document count and lengths change with every batch).
    @torch.compiler.disable
    def attend(q, k, v, batch: Batch) -> torch.Tensor:
        # Autocast would turn the emulator's fp32 matmuls into bf16 ones.
        with torch.autocast(q.device.type, enabled=False):
            return flamia.flash_attn_varlen_func(
                q, k, v, batch.cu_seqlens, batch.cu_seqlens, batch.max_seqlen, batch.max_seqlen,
                causal=True, recipe=recipe, backend=backend)
    return attend


def own_attention(spec: RunSpec, cfg: TrainConfig) -> AttnFn:
    return sdpa_attention if spec.attn == "sdpa" else flamia_attention(spec.recipe, cfg.backend)


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
    """Mean next-byte cross-entropy (nats per byte), bf16 autocast, fp32 loss."""
    with torch.autocast(batch.x.device.type, dtype=torch.bfloat16):
        logits = model(batch, attn)
    return F.cross_entropy(logits.float(), batch.y.reshape(-1))


# ---------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------

@torch.no_grad()
def validation_loss(model, batches: list[Batch], attn: AttnFn) -> float:
    return float(torch.stack([loss_of(model, b, attn) for b in batches]).mean())


def _attention_grads(attn: AttnFn, qkv, batch: Batch, d_out: torch.Tensor,
                     dtype: torch.dtype) -> torch.Tensor:
    """(dQ, dK, dV) of ``attn`` fed ``qkv`` in ``dtype``, flattened and concatenated, fp32."""
    leaves = [t.detach().float().requires_grad_() for t in qkv]
    out = attn(*(t.to(dtype) for t in leaves), batch)
    return torch.cat([g.flatten() for g in torch.autograd.grad(out, leaves, d_out.to(out.dtype))])


def single_step_cos(model, batch: Batch, own: AttnFn) -> float:
    """Cosine between the run's and exact attention gradients at the first layer: q, k, v and
    the upstream gradient dO come from the model itself on ``batch`` (through its own
    attention); own attention sees them in bf16, as in training, exact attention in fp32."""
    seen = []

    def capture(q, k, v, b):
        out = own(q, k, v, b)
        if not seen:
            seen.append(((q, k, v), out))
        return out

    loss = loss_of(model, batch, capture)
    qkv, out = seen[0]
    d_out = torch.autograd.grad(loss, out)[0]
    g_own = _attention_grads(own, qkv, batch, d_out, qkv[0].dtype).double()
    g_exact = _attention_grads(exact_attention, qkv, batch, d_out, torch.float32).double()
    return float(F.cosine_similarity(g_own, g_exact, dim=0))


# ---------------------------------------------------------------------------------------------
# Training state, checkpoints and results
# ---------------------------------------------------------------------------------------------

@dataclass
class Progress:
    """What a checkpoint carries besides weights and optimizer state: the steps taken, the
    evaluation records, the sums since the last evaluation, and the throughput so far."""

    step: int = 0
    records: list = field(default_factory=list)
    loss_sum: float = 0.0
    gnorm_sum: float = 0.0
    since_eval: int = 0
    train_tokens: int = 0
    train_seconds: float = 0.0
    diverged_step: int | None = None


def _atomic_write(path: Path, write) -> None:
    # A piece killed at its time limit must leave the previous file intact.
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def save_checkpoint(path: Path, cfg: TrainConfig, model, optimizer, progress: Progress) -> None:
    state = {"config": asdict(cfg), "model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "progress": asdict(progress)}
    _atomic_write(path, lambda tmp: torch.save(state, tmp))


def load_checkpoint(path: Path, cfg: TrainConfig, model, optimizer) -> Progress:
    """Restore a run; refuses a checkpoint trained with another configuration."""
    state = torch.load(path, map_location=next(model.parameters()).device, weights_only=True)
    now = asdict(cfg)
    changed = [f"{k}: {state['config'].get(k)!r} -> {v!r}" for k, v in now.items()
               if k not in PIECE_FIELDS and state["config"].get(k) != v]
    if changed:
        raise ValueError(f"--resume: {path} was trained with another configuration ({'; '.join(changed)}); "
                         "resume with the same settings or start afresh without --resume")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return Progress(**state["progress"])


def write_results(path: Path, cfg: TrainConfig, attention: dict, progress: Progress) -> None:
    """<run>.json: the config, the attention used, and one record per evaluation."""
    doc = {"run": cfg.run, "config": asdict(cfg), "attention": attention,
           "done": progress.diverged_step is not None or progress.step >= cfg.steps,
           "steps_done": progress.step, "diverged_step": progress.diverged_step,
           "tokens_per_s": progress.train_tokens / progress.train_seconds if progress.train_seconds else None,
           "records": progress.records}
    _atomic_write(path, lambda tmp: tmp.write_text(json.dumps(doc, indent=1)))


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------

def learning_rate(cfg: TrainConfig, step: int) -> float:
    """Linear warmup over ``warmup`` steps, then cosine decay to ``min_lr_ratio * lr``."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices only (not on norms)."""
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    fused = params[0].device.type == "cuda"
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=fused)


def describe_attention(spec: RunSpec, cfg: TrainConfig, device: torch.device) -> dict:
    """What the run's attention is, with the flamia backend the API resolves to."""
    exact = "sdpa float32, same document mask"
    if spec.attn == "sdpa":
        return {"attn": "sdpa", "dtype": "bfloat16", "recipe": None, "backend": None, "exact": exact}
    backend = resolve_backend(cfg.backend, spec.recipe, torch.empty(0, device=device))
    return {"attn": "flamia", "recipe": asdict(spec.recipe), "backend": backend, "exact": exact}


def evaluate(model, val_batches: list[Batch], own: AttnFn, progress: Progress) -> dict:
    """One record: validation loss through own and exact attention, the mean training loss
    and pre-clipping gradient norm since the last evaluation, and single_step_cos. (The
    model has no dropout: training and evaluation modes compute the same.)"""
    record = {"step": progress.step,
              "val_loss_own": validation_loss(model, val_batches, own),
              "val_loss_exact": validation_loss(model, val_batches, exact_attention),
              "grad_norm": progress.gnorm_sum / max(1, progress.since_eval),
              "train_loss": progress.loss_sum / max(1, progress.since_eval),
              "single_step_cos": single_step_cos(model, val_batches[0], own)}
    progress.loss_sum = progress.gnorm_sum = 0.0
    progress.since_eval = 0
    return record


@dataclass
class Window:
    """Throughput since the last log line."""

    seconds: float = 0.0
    tokens: int = 0
    flops: float = 0.0
    steps: int = 0

    def summary(self, peak_tflops: float) -> str:
        mfu = self.flops / self.seconds / (peak_tflops * 1e12)
        return (f"{1e3 * self.seconds / self.steps:.1f} ms/step | "
                f"{self.tokens / self.seconds / 1e3:.1f}k tok/s | MFU {mfu:.1%}")


def train_step(model, optimizer, batch: Batch, own: AttnFn, lr: float,
               grad_clip: float) -> tuple[float, float]:
    """One optimizer step; returns (loss, pre-clipping gradient norm)."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    loss = loss_of(model, batch, own)
    loss.backward()
    gnorm = nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    loss_v, gnorm_v = torch.stack([loss.detach(), gnorm]).tolist()  # the step's one sync
    return loss_v, gnorm_v


class PieceClock:
    """Decides when a piece must stop to checkpoint within ``time_limit`` seconds of
    ``t_start``: the next step, its evaluation if one is due, and a save must still fit."""

    def __init__(self, cfg: TrainConfig, t_start: float):
        self.cfg, self.t_start = cfg, t_start
        self.step_s, self.eval_s, self.save_s = 0.0, None, 5.0

    def out_of_time(self, next_step: int) -> bool:
        if self.cfg.time_limit is None:
            return False
        eval_due = next_step % self.cfg.eval_interval == 0 or next_step == self.cfg.steps
        eval_s = self.eval_s if self.eval_s is not None else 3 * self.cfg.eval_batches * self.step_s
        need = 2 * self.step_s + (eval_s if eval_due else 0.0) + self.save_s
        return time.monotonic() - self.t_start + need > self.cfg.time_limit


def train(cfg: TrainConfig, resume: bool = False, t_start: float | None = None) -> Progress:
    """Train (or resume) one run; writes its JSON at every evaluation and at exit."""
    t_start = time.monotonic() if t_start is None else t_start
    spec = run_spec(cfg)
    auto = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(auto if cfg.device == "auto" else cfg.device)
    torch.manual_seed(cfg.seed)
    sep = codecs.decode(cfg.doc_sep, "unicode_escape").encode("latin-1")
    train_split, val_split, _ = split(load_bytes(cfg.data))
    train_data, val_data = PackedText(train_split, sep, cfg.context), PackedText(val_split, sep, cfg.context)
    val_offsets = val_data.spread_offsets(cfg.eval_batches * cfg.batch_size)
    val_batches = [val_data.batch(o, device) for o in np.split(val_offsets, cfg.eval_batches)]

    model = GPT(cfg).to(device)
    optimizer = make_optimizer(model, cfg)
    ckpt_path = Path(cfg.ckpt_dir) / f"{cfg.run}.pt"
    results_path = Path(cfg.results_dir) / f"{cfg.run}.json"
    resumed = resume and ckpt_path.exists()
    progress = load_checkpoint(ckpt_path, cfg, model, optimizer) if resumed else Progress()
    attention = describe_attention(spec, cfg, device)
    own = own_attention(spec, cfg)
    step_model = torch.compile(model) if cfg.compile else model

    print(f"run {cfg.run}: {attention}")
    print("\n".join(f"  {k} = {v!r}" for k, v in asdict(cfg).items()))
    print(f"  parameters: {sum(p.numel() for p in model.parameters()):,} | device {device} | "
          f"{f'resumed at step {progress.step}' if resumed else 'fresh start'}", flush=True)

    clock = PieceClock(cfg, t_start)
    window = Window()
    saved_at = progress.step

    def checkpoint() -> int:
        t_save = time.monotonic()
        save_checkpoint(ckpt_path, cfg, model, optimizer, progress)
        clock.save_s = time.monotonic() - t_save
        return progress.step

    while progress.step < cfg.steps and progress.diverged_step is None:
        if clock.out_of_time(progress.step + 1):
            print(f"time limit {cfg.time_limit:.0f}s: stopping at step {progress.step}", flush=True)
            break
        batch = train_data.batch(train_data.random_offsets(cfg.batch_size, cfg.seed, progress.step), device)
        lr = learning_rate(cfg, progress.step)
        t0 = time.perf_counter()
        loss_v, gnorm_v = train_step(step_model, optimizer, batch, own, lr, cfg.grad_clip)
        dt = time.perf_counter() - t0
        clock.step_s = dt
        progress.step += 1
        if not math.isfinite(loss_v):
            progress.diverged_step = progress.step
            print(f"step {progress.step}: loss {loss_v}, the run diverged", flush=True)
            break
        progress.loss_sum += loss_v
        progress.gnorm_sum += gnorm_v
        progress.since_eval += 1
        progress.train_tokens += batch.tokens
        progress.train_seconds += dt
        window.seconds += dt
        window.tokens += batch.tokens
        window.flops += model.flops_per_step(cfg, batch)
        window.steps += 1

        if progress.step % cfg.log_interval == 0:
            print(f"{cfg.run} step {progress.step}/{cfg.steps} | loss {loss_v:.4f} | lr {lr:.2e} | "
                  f"gnorm {gnorm_v:.3f} | {window.summary(cfg.peak_tflops)}", flush=True)
            window = Window()
        if progress.step % cfg.eval_interval == 0 or progress.step == cfg.steps:
            t_eval = time.monotonic()
            progress.records.append({"run": cfg.run, **evaluate(model, val_batches, own, progress)})
            clock.eval_s = time.monotonic() - t_eval
            write_results(results_path, cfg, attention, progress)
            r = progress.records[-1]
            print(f"{cfg.run} eval step {r['step']} | val own {r['val_loss_own']:.4f} | exact "
                  f"{r['val_loss_exact']:.4f} | grad norm {r['grad_norm']:.3f} | single-step cos "
                  f"{r['single_step_cos']:.5f} | {clock.eval_s:.1f}s", flush=True)
        if progress.step % cfg.ckpt_interval == 0:
            saved_at = checkpoint()
        if cfg.stop_at is not None and progress.step >= cfg.stop_at:
            break

    if progress.step != saved_at and progress.diverged_step is None:
        checkpoint()
    write_results(results_path, cfg, attention, progress)
    return progress


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------

CHOICES = {"run": sorted(RUNS), "backend": ["triton", "reference"]}


def make_config(profile: str = "smoke", **overrides) -> TrainConfig:
    """A profile's settings with ``overrides`` on top (names as TrainConfig's fields)."""
    if profile not in PROFILES:
        raise ValueError(f"--profile: unknown profile {profile!r}; choose one of {sorted(PROFILES)}")
    cfg = TrainConfig(**{**PROFILES[profile], "profile": profile, **overrides})
    if cfg.run not in RUNS:
        raise ValueError(f"--run: unknown run {cfg.run!r}; choose one of {sorted(RUNS)}")
    if cfg.d_model % cfg.n_head:
        raise ValueError(f"--d-model: {cfg.d_model} is not a multiple of --n-head {cfg.n_head}")
    for name in ("steps", "batch_size", "context", "eval_interval", "eval_batches", "ckpt_interval",
                 "log_interval"):
        if getattr(cfg, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')}: must be positive, got {getattr(cfg, name)}")
    return cfg


def _arg_type(hint):
    """int for ``int | None`` and so on: the type argparse converts to."""
    return next((a for a in typing.get_args(hint) if a is not type(None)), hint)


def parse_args(argv: list[str] | None) -> tuple[TrainConfig, argparse.Namespace]:
    p = argparse.ArgumentParser(prog="python -m flamia.train", description=__doc__.split("\n\n")[0])
    p.add_argument("--resume", action="store_true", help="continue from <ckpt_dir>/<run>.pt if it exists")
    p.add_argument("--report", action="store_true", help="write the results table and curves, then exit")
    p.add_argument("--baseline", metavar="DIR:RUN,RUN", help="with --report: also these runs of another results folder")
    p.add_argument("--profile", choices=sorted(PROFILES), default="smoke",
                   help="the settings the flags below change")
    hints = typing.get_type_hints(TrainConfig)
    flags = [f for f in fields(TrainConfig) if f.name != "profile"]
    for f in flags:
        kind = _arg_type(hints[f.name])
        option = "--" + f.name.replace("_", "-")
        if kind is bool:
            p.add_argument(option, action=argparse.BooleanOptionalAction, default=None)
            continue
        per_profile = {name: values.get(f.name, f.default) for name, values in PROFILES.items()}
        default = (f"default {f.default!r}" if len(set(map(repr, per_profile.values()))) == 1
                   else ", ".join(f"{name}: {value!r}" for name, value in per_profile.items()))
        p.add_argument(option, type=kind, default=None, choices=CHOICES.get(f.name), help=default)
    args = p.parse_args(argv)
    overrides = {f.name: getattr(args, f.name) for f in flags if getattr(args, f.name) is not None}
    return make_config(args.profile, **overrides), args


def main(argv: list[str] | None = None) -> None:
    t_start = time.monotonic()
    cfg, args = parse_args(argv)
    if args.report:
        from flamia.train_report import load_baseline, write_report
        baseline = load_baseline(args.baseline) if args.baseline else None
        for path in write_report(Path(cfg.results_dir), baseline):
            print(path)
        return
    train(cfg, resume=args.resume, t_start=t_start)


if __name__ == "__main__":
    main()
