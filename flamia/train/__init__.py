"""Byte-level GPT on packed documents: the paper's training experiment (Section 4.5).

Every run trains the same model with the same seed, data order and hyperparameters; only
the attention numerics differ (``RUNS``). Attention goes through ``flamia.flash_attn_varlen_func``
on packed documents (``cu_seqlens`` per row), or through PyTorch SDPA with a block-diagonal
causal mask for the BF16 baseline. At every evaluation a run records its validation loss
through its own attention and through exact attention (SDPA in fp32, same mask), the mean
gradient norm, and ``single_step_cos``: the cosine between its attention gradients
(dQ, dK, dV) and the exact ones on the first layer of a fixed validation batch.

    flamia train --run mxfp8 [--profile smoke|paper] [--steps 300 ...] [--resume]
    flamia train --report     # results table + curves from experiments/results/

Outputs: ``<results_dir>/<run>.json`` (config and one record per evaluation) and
``<ckpt_dir>/<run>.pt`` (resumable; ``--time-limit`` and ``--stop-at`` end a piece early).

Modules, each read top to bottom: ``config`` (runs, settings, profiles), ``model`` (attention
on packed rows and the GPT), ``evaluate`` (validation losses, single_step_cos), ``state``
(checkpoints, results JSON), ``loop`` (the training loop), ``cli`` (the command line),
``report`` (table and curves). The corpus and packed rows are ``flamia.data``.
"""
from .cli import main, parse_args
from .config import PROFILES, RUNS, RunSpec, SettingError, TrainConfig, make_config, run_spec
from .evaluate import single_step_cos, validation_loss
from .loop import learning_rate, train
from .model import GPT, exact_attention, flamia_attention, loss_of, sdpa_attention

__all__ = ["main", "parse_args", "PROFILES", "RUNS", "RunSpec", "SettingError", "TrainConfig", "make_config",
           "run_spec", "single_step_cos", "validation_loss", "learning_rate", "train", "GPT",
           "exact_attention", "flamia_attention", "loss_of", "sdpa_attention"]
