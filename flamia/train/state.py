"""A run's state on disk: ``<ckpt_dir>/<run>.pt`` (resumable) and ``<results_dir>/<run>.json``
(the config, the attention used and one record per evaluation)."""
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .config import PIECE_FIELDS, SettingError, TrainConfig


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
    # torch's CPU generator too: a stochastic recipe (fp4) draws each call's seed from it, so a
    # resumed run continues the same sequence.
    state = {"config": asdict(cfg), "model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "progress": asdict(progress), "cpu_rng": torch.get_rng_state()}
    _atomic_write(path, lambda tmp: torch.save(state, tmp))


def load_checkpoint(path: Path, cfg: TrainConfig, model, optimizer) -> Progress:
    """Restore a run; refuses a checkpoint trained with another configuration."""
    state = torch.load(path, map_location=next(model.parameters()).device, weights_only=True)
    now = asdict(cfg)
    changed = [f"{k}: {state['config'].get(k)!r} -> {v!r}" for k, v in now.items()
               if k not in PIECE_FIELDS and state["config"].get(k) != v]
    if changed:
        raise SettingError(f"--resume: {path} was trained with another configuration ({'; '.join(changed)}); "
                           "resume with the same settings or start afresh without --resume")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    if "cpu_rng" in state:
        torch.set_rng_state(state["cpu_rng"].cpu())
    return Progress(**state["progress"])


def write_results(path: Path, cfg: TrainConfig, attention: dict, progress: Progress) -> None:
    """<run>.json: the config, the attention used, and one record per evaluation."""
    doc = {"run": cfg.run, "config": asdict(cfg), "attention": attention,
           "done": progress.diverged_step is not None or progress.step >= cfg.steps,
           "steps_done": progress.step, "diverged_step": progress.diverged_step,
           "tokens_per_s": progress.train_tokens / progress.train_seconds if progress.train_seconds else None,
           "records": progress.records}
    _atomic_write(path, lambda tmp: tmp.write_text(json.dumps(doc, indent=1)))
