"""The training loop: data, optimizer, steps, evaluations, checkpoints and progress lines.

``train`` trains (or resumes) one run in a piece that ends at ``steps``, at ``stop_at``, or
before ``time_limit`` would be overrun, and always leaves a checkpoint to resume from.
"""
import codecs
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from flamia.data import Batch, PackedText, load_bytes, split

from .config import SettingError, TrainConfig, run_spec
from .evaluate import evaluate
from .model import GPT, AttnFn, describe_attention, loss_of, own_attention
from .state import Progress, load_checkpoint, save_checkpoint, write_results

# A progress line at least this often (seconds), so a slow device shows every step.
LOG_SECONDS = 30.0


# ---------------------------------------------------------------------------------------------
# Device and data
# ---------------------------------------------------------------------------------------------

def _separator(doc_sep: str) -> bytes:
    """``--doc-sep`` with its Python escapes decoded, as bytes."""
    try:
        sep = codecs.decode(doc_sep, "unicode_escape").encode("latin-1")
    except UnicodeError:
        sep = b""
    if not sep:
        raise SettingError(f"--doc-sep: {doc_sep!r} is not a non-empty byte string "
                           r"(Python escapes allowed, e.g. '\n\n')")
    return sep


def resolve_device(name: str) -> torch.device:
    """``--device``: "auto" (cuda when present, else cpu) or a torch device that is here."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise SettingError(f"--device: unknown device {name!r}; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SettingError(f"--device: {name} asked for, but no CUDA device is here; use auto or cpu")
    return device


def load_data(cfg: TrainConfig, device: torch.device) -> tuple[PackedText, list[Batch]]:
    """The training split, and the fixed validation set: ``eval_batches`` batches of
    ``batch_size`` rows spread evenly over the validation split."""
    path = Path(cfg.data)
    if not path.exists():
        raise SettingError(f"--data: no such file {path}; build it (48 MB of English text) with "
                           f"`python -m flamia.data --out {path}` or ../shared/data/build_english_text.sh, "
                           "or pass any file: --data PATH (read as bytes; .xz is decompressed)")
    sep = _separator(cfg.doc_sep)
    train_split, val_split, _ = split(load_bytes(path))
    if len(val_split) < cfg.context + 1:
        raise SettingError(f"--data: {path} is too small: its 5% validation split holds {len(val_split)} "
                           f"bytes, less than one row of --context {cfg.context} + 1")
    train_data, val_data = PackedText(train_split, sep, cfg.context), PackedText(val_split, sep, cfg.context)
    val_offsets = val_data.spread_offsets(cfg.eval_batches * cfg.batch_size)
    return train_data, [val_data.batch(o, device) for o in np.split(val_offsets, cfg.eval_batches)]


# ---------------------------------------------------------------------------------------------
# Optimisation
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


# ---------------------------------------------------------------------------------------------
# Time: when a piece must stop, throughput and progress lines
# ---------------------------------------------------------------------------------------------

class PieceClock:
    """Decides when a piece must stop to checkpoint within ``time_limit`` seconds of
    ``t_start``: the next step, its evaluation if one is due, and a save must still fit."""

    def __init__(self, cfg: TrainConfig, t_start: float):
        self.cfg, self.t_start = cfg, t_start
        self.step_s, self.eval_s, self.save_s = 0.0, None, 5.0

    def eval_estimate(self) -> float:
        """Seconds of an evaluation: the last one, else about 3 steps per validation batch."""
        return self.eval_s if self.eval_s is not None else 3 * self.cfg.eval_batches * self.step_s

    def out_of_time(self, next_step: int) -> bool:
        if self.cfg.time_limit is None:
            return False
        eval_due = next_step % self.cfg.eval_interval == 0 or next_step == self.cfg.steps
        need = 2 * self.step_s + (self.eval_estimate() if eval_due else 0.0) + self.save_s
        return time.monotonic() - self.t_start + need > self.cfg.time_limit


@dataclass
class Window:
    """The steps since the last progress line: their compute seconds, tokens and FLOPs."""

    started: float = field(default_factory=time.monotonic)
    seconds: float = 0.0
    tokens: int = 0
    flops: float = 0.0
    steps: int = 0

    def summary(self, peak_tflops: float) -> str:
        mfu = self.flops / self.seconds / (peak_tflops * 1e12)
        return (f"{1e3 * self.seconds / self.steps:.1f} ms/step | "
                f"{self.tokens / self.seconds / 1e3:.1f}k tok/s | MFU {mfu:.1%}")


def duration(seconds: float) -> str:
    """``seconds`` as "1h02m", "4m05s" or "7s"."""
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def print_start(cfg: TrainConfig, attention: dict, model: GPT, device: torch.device,
                progress: Progress, resumed: bool) -> None:
    """The run, its attention and every setting, before the first step."""
    print(f"run {cfg.run}: {attention}")
    print("\n".join(f"  {k} = {v!r}" for k, v in asdict(cfg).items()))
    print(f"  parameters: {sum(p.numel() for p in model.parameters()):,} | device {device} | "
          f"{f'resumed at step {progress.step}' if resumed else 'fresh start'} | "
          f"{cfg.batch_size * cfg.context:,} tokens/step | a line every {cfg.log_interval} steps "
          f"or {LOG_SECONDS:.0f} s", flush=True)


# ---------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------

def train(cfg: TrainConfig, resume: bool = False, t_start: float | None = None) -> Progress:
    """Train (or resume) one run; writes its JSON at every evaluation and at exit."""
    t_start = time.monotonic() if t_start is None else t_start
    spec = run_spec(cfg)
    device = resolve_device(cfg.device)
    attention = describe_attention(spec, cfg, device)
    torch.manual_seed(cfg.seed)
    train_data, val_batches = load_data(cfg, device)

    model = GPT(cfg).to(device)
    optimizer = make_optimizer(model, cfg)
    ckpt_path = Path(cfg.ckpt_dir) / f"{cfg.run}.pt"
    results_path = Path(cfg.results_dir) / f"{cfg.run}.json"
    resumed = resume and ckpt_path.exists()
    progress = load_checkpoint(ckpt_path, cfg, model, optimizer) if resumed else Progress()
    own = own_attention(spec, cfg)
    step_model = torch.compile(model) if cfg.compile else model
    print_start(cfg, attention, model, device, progress, resumed)

    clock = PieceClock(cfg, t_start)
    window = Window()
    first_step, t_loop = progress.step, time.monotonic()
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

        if (progress.step % cfg.log_interval == 0 or progress.step in (first_step + 1, cfg.steps)
                or time.monotonic() - window.started >= LOG_SECONDS):
            per_step = (time.monotonic() - t_loop) / (progress.step - first_step)
            print(f"{cfg.run} step {progress.step}/{cfg.steps} | loss {loss_v:.4f} | lr {lr:.2e} | "
                  f"gnorm {gnorm_v:.3f} | {window.summary(cfg.peak_tflops)} | "
                  f"ETA {duration(per_step * (cfg.steps - progress.step))}", flush=True)
            window = Window()
        if progress.step % cfg.eval_interval == 0 or progress.step == cfg.steps:
            if clock.eval_estimate() >= LOG_SECONDS:
                print(f"{cfg.run} evaluating at step {progress.step}: {cfg.eval_batches} validation "
                      "batches through own and exact attention", flush=True)
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
    print(f"{cfg.run}: step {progress.step}/{cfg.steps} in {duration(time.monotonic() - t_start)} | "
          f"results {results_path} | checkpoint {ckpt_path}", flush=True)
    return progress
