"""The FLOP model behind every TFLOP/s figure.

A document of n tokens costs 4 * n^2 * d * heads FLOPs forward (two matmuls of 2 * n^2 * d
per query head), half of it when causal. The backward counts 2.5 times the forward (five
matmuls instead of two) and the training call 3.5 times (forward + backward). Query heads
count, so GQA changes nothing; quantization and softmax are not counted.
"""
from .workloads import Workload

MODE_FACTORS = {"fwd": 1.0, "bwd": 2.5, "train": 3.5}


def forward_flops(workload: Workload) -> float:
    per_doc = sum(4.0 * n * n * workload.head_dim * workload.heads_q for n in workload.lengths)
    return per_doc / 2 if workload.causal else per_doc


def flops(workload: Workload, mode: str) -> float:
    """FLOPs of one call of ``mode`` ("fwd", "bwd" or "train") on ``workload``."""
    if mode not in MODE_FACTORS:
        raise ValueError(f"mode: expected one of {sorted(MODE_FACTORS)}, got {mode!r}")
    return forward_flops(workload) * MODE_FACTORS[mode]


def tflops_per_s(workload: Workload, mode: str, ms: float) -> float:
    return flops(workload, mode) / (ms * 1e-3) / 1e12
