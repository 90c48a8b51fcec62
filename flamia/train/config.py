"""The runs (one attention numerics each), the training configuration and its profiles.

Every run trains the same model with the same seed, data order and hyperparameters; only
its ``RunSpec`` differs. ``TrainConfig``'s defaults are the paper profile; ``PROFILES`` name
the smaller ones, and ``make_config`` checks a profile with overrides on top.
"""
import math
from dataclasses import dataclass

from flamia.recipes import Recipe


class SettingError(ValueError):
    """A setting that cannot work; the message names its flag and what is allowed."""


@dataclass(frozen=True)
class RunSpec:
    """attn: "sdpa" (PyTorch, BF16) or "flamia"; recipe: the flamia Recipe (flamia only)."""

    attn: str
    recipe: Recipe | None = None


# The runs before p_sum_codes (NUMERICS.md 3b) take l from p, as they were measured.
RUNS = {
    "bf16": RunSpec("sdpa"),
    "mxfp8": RunSpec("flamia", Recipe("mxfp8", p_sum_codes=False)),
    # Scores from BF16 codes of Q and K, where E4M3's lose dQ and dK on sharp attention.
    "mxfp8_bf16s": RunSpec("flamia", Recipe("mxfp8", bf16_scores=True, p_sum_codes=False)),
    "nvfp4": RunSpec("flamia", Recipe("nvfp4", p_sum_codes=False)),
    "fp4": RunSpec("flamia", Recipe("fp4", p_sum_codes=False)),
    # 4-bit P groups scaled before the causal mask: future keys leak into earlier rows.
    "leak": RunSpec("flamia", Recipe("nvfp4", p4_scale_before_mask=True, p_sum_codes=False)),
    "per_tensor": RunSpec("flamia", Recipe("mxfp8", per_tensor_scales=True, p_sum_codes=False)),
    # Forward/backward mismatches: P precision, diagonal tiling, exponential.
    "mm_prepr": RunSpec("flamia", Recipe("nvfp4", fwd_p4_bwd_p8=True, p_sum_codes=False)),
    "mm_diag": RunSpec("flamia", Recipe("nvfp4", fwd_diag_block_m=256, p_sum_codes=False)),
    "mm_exp": RunSpec("flamia", Recipe("mxfp8", fwd_approx_exp=True, p_sum_codes=False)),
    "nvfp4_bf16s": RunSpec("flamia", Recipe("nvfp4", bf16_scores=True, p_sum_codes=False)),
    # l from the P codes' values (NUMERICS.md 3b): a row's used weights that do not sum to
    # one bias its dS on every tile. mxfp8 trained with it where mxfp8 and the BF16-score
    # runs diverged, so it is the consistent baseline of the mismatches on this size.
    "mxfp8_sumc": RunSpec("flamia", Recipe("mxfp8", p_sum_codes=True)),
    "mxfp8_bf16s_sumc": RunSpec("flamia", Recipe("mxfp8", bf16_scores=True, p_sum_codes=True)),
    "nvfp4_sumc": RunSpec("flamia", Recipe("nvfp4", p_sum_codes=True)),
    "mm_prepr_sumc": RunSpec("flamia", Recipe("nvfp4", fwd_p4_bwd_p8=True, p_sum_codes=True)),
    "mm_diag_sumc": RunSpec("flamia", Recipe("nvfp4", fwd_diag_block_m=256, p_sum_codes=True)),
    "mm_exp_sumc": RunSpec("flamia", Recipe("mxfp8", fwd_approx_exp=True, p_sum_codes=True)),
}
# Each mismatch ablation and the consistent run it changes (the paper's second claim).
MISMATCH_BASELINES = {"mm_prepr": "nvfp4", "mm_diag": "nvfp4", "mm_exp": "mxfp8", "mm_prepr_sumc": "nvfp4_sumc",
                      "mm_diag_sumc": "nvfp4_sumc", "mm_exp_sumc": "mxfp8_sumc"}


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
    # The smoke model trained 2.5x longer.
    "small": dict(n_layer=4, d_model=256, n_head=4, batch_size=8, steps=1000, warmup=100, lr=2e-3,
                  eval_interval=100, eval_batches=4, ckpt_interval=100),
}
# The small and paper profiles with every 4-bit P run summing l from its 4-bit values.
for _name in ("small", "paper"):
    PROFILES[f"{_name}-sumq"] = {**PROFILES[_name], "p4_sum_quantized": True}

# Fields a resumed piece may change: they do not change what is trained.
PIECE_FIELDS = {"data", "results_dir", "ckpt_dir", "device", "compile", "log_interval",
                "peak_tflops", "time_limit", "stop_at"}

POSITIVE_FIELDS = ("n_layer", "d_model", "n_head", "context", "batch_size", "steps", "lr", "grad_clip",
                   "eval_interval", "eval_batches", "ckpt_interval", "log_interval", "peak_tflops")
# Fields in [low, high) or [low, high]: (low, high, high included).
RANGES = {"warmup": (0, math.inf, False), "weight_decay": (0, math.inf, False),
          "min_lr_ratio": (0, 1, True), "beta1": (0, 1, False), "beta2": (0, 1, False)}


def make_config(profile: str = "smoke", **overrides) -> TrainConfig:
    """A profile's settings with ``overrides`` on top (names as TrainConfig's fields)."""
    if profile not in PROFILES:
        raise SettingError(f"--profile: unknown profile {profile!r}; choose one of {sorted(PROFILES)}")
    cfg = TrainConfig(**{**PROFILES[profile], "profile": profile, **overrides})
    if cfg.run not in RUNS:
        raise SettingError(f"--run: unknown run {cfg.run!r}; choose one of {sorted(RUNS)}")
    for name in POSITIVE_FIELDS:
        if not getattr(cfg, name) > 0:
            raise SettingError(f"--{name.replace('_', '-')}: must be positive, got {getattr(cfg, name)}")
    for name, (low, high, closed) in RANGES.items():
        value = getattr(cfg, name)
        if not (low <= value <= high if closed else low <= value < high):
            raise SettingError(f"--{name.replace('_', '-')}: must be in [{low}, {high}{']' if closed else ')'}, "
                               f"got {value}")
    if cfg.d_model % cfg.n_head:
        raise SettingError(f"--d-model: {cfg.d_model} is not a multiple of --n-head {cfg.n_head}")
    return cfg


def run_spec(cfg: TrainConfig) -> RunSpec:
    """The run's attention, with ``p4_sum_quantized`` set on its recipe when the config asks
    for it and the recipe has 4-bit P (every nvfp4 and fp4 run, ablations included) whose l
    does not already come from its codes (``p_sum_codes``)."""
    spec = RUNS[cfg.run]
    if cfg.p4_sum_quantized and spec.recipe is not None and spec.recipe.has_p4 and not spec.recipe.p_sum_codes:
        return RunSpec(spec.attn, spec.recipe.with_(p4_sum_quantized=True))
    return spec
