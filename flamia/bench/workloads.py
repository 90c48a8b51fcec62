"""The benchmark workloads, in one registry: each packs a list of documents into one row.

Base workloads (paper Section 4.1): causal, 16 query heads, 16 KV heads, head dim 128.

    eq4x4k          4 documents of 4096 tokens                         (16384 tokens)
    eq8x8k          8 documents of 8192 tokens                         (65536 tokens)
    skew8k+32x256   one document of 8192 tokens and 32 of 256          (16384 tokens)
    skew8k+224x256  one document of 8192 tokens and 224 of 256         (65536 tokens)
    logu11-16k      11 documents, log-uniform lengths in [128, 8192]   (16384 tokens)
    logu29-64k      29 documents, log-uniform lengths in [128, 8192]   (65536 tokens)

Each base has variants, named by suffixes in this order: ``-nc`` non-causal, ``-gqa`` 16
query heads over 4 KV heads, ``-d64`` head dim 64 (e.g. ``logu11-16k-nc-gqa``). Groups
select several at once: ``causal`` (the six bases), ``noncausal``, ``gqa``, ``d64`` (each
one variant of every base), ``all``.
"""
import math
import random
import zlib
from dataclasses import dataclass, replace
from itertools import product

import torch

from ..workload import PackedInputs, make_packed_inputs

LOG_UNIFORM_BOUNDS = (128, 8192)
_MAX_DRAWS = 10_000


def log_uniform_lengths(count: int, total: int, seed: int,
                        bounds: tuple[int, int] = LOG_UNIFORM_BOUNDS) -> tuple[int, ...]:
    """``count`` document lengths drawn log-uniformly in ``bounds`` and rescaled to sum to
    ``total`` exactly (largest-remainder rounding). A draw whose rescaled lengths leave the
    bounds is rejected and the next one taken from the same seeded stream, so the result
    stays log-uniform in shape and is fixed by ``seed``."""
    low, high = bounds
    if not count * low <= total <= count * high:
        raise ValueError(f"total: {count} documents in [{low}, {high}] cannot sum to {total}")
    rng = random.Random(seed)
    for _ in range(_MAX_DRAWS):
        draws = [math.exp(rng.uniform(math.log(low), math.log(high))) for _ in range(count)]
        lengths = _round_to_total([x * total / sum(draws) for x in draws], total)
        if low <= min(lengths) and max(lengths) <= high:
            return tuple(lengths)
    raise ValueError(f"bounds: no draw of {count} lengths in {bounds} summing to {total} "
                     f"within {_MAX_DRAWS} tries")


def _round_to_total(values: list[float], total: int) -> list[int]:
    floors = [math.floor(x) for x in values]
    by_remainder = sorted(range(len(values)), key=lambda i: floors[i] - values[i])
    for i in by_remainder[:total - sum(floors)]:
        floors[i] += 1
    return floors


@dataclass(frozen=True)
class Workload:
    """Documents of ``lengths`` tokens packed into one row; ``seed`` fixes its inputs."""

    name: str
    lengths: tuple[int, ...]
    causal: bool = True
    heads_q: int = 16
    heads_kv: int = 16
    head_dim: int = 128
    seed: int = 0

    @property
    def total(self) -> int:
        return sum(self.lengths)

    @property
    def equal(self) -> bool:
        """Every document has the same length (dense-only peers accept these)."""
        return len(set(self.lengths)) == 1

    @property
    def gqa(self) -> bool:
        return self.heads_kv < self.heads_q


BASES = {
    "eq4x4k": (4096,) * 4,
    "eq8x8k": (8192,) * 8,
    "skew8k+32x256": (8192,) + (256,) * 32,
    "skew8k+224x256": (8192,) + (256,) * 224,
    "logu11-16k": log_uniform_lengths(11, 16384, seed=11),
    "logu29-64k": log_uniform_lengths(29, 65536, seed=29),
}
# suffix -> (field changes, group name); a workload may carry several suffixes, in this order.
VARIANTS = {
    "-nc": (dict(causal=False), "noncausal"),
    "-gqa": (dict(heads_kv=4), "gqa"),
    "-d64": (dict(head_dim=64), "d64"),
}


def _build_registry() -> dict[str, Workload]:
    registry = {}
    for base, lengths in BASES.items():
        for chosen in product((False, True), repeat=len(VARIANTS)):
            suffixes = [s for s, keep in zip(VARIANTS, chosen) if keep]
            name = base + "".join(suffixes)
            changes = {k: v for s in suffixes for k, v in VARIANTS[s][0].items()}
            # crc32 of the name: a seed stable across runs and Python versions.
            registry[name] = Workload(name, lengths, seed=zlib.crc32(name.encode()), **changes)
    return registry


WORKLOADS = _build_registry()
GROUPS = {
    "causal": tuple(BASES),
    **{group: tuple(base + suffix for base in BASES) for suffix, (_, group) in VARIANTS.items()},
    "all": tuple(WORKLOADS),
}


def select_workloads(spec: str) -> list[Workload]:
    """A comma-separated list of workload names and group names -> workloads, in order,
    without repeats."""
    chosen = []
    for token in filter(None, (t.strip() for t in spec.split(","))):
        names = GROUPS.get(token, (token,))
        for name in names:
            if name not in WORKLOADS:
                raise ValueError(f"--workloads: unknown workload {name!r}; choose names of "
                                 f"{sorted(BASES)} with suffixes {list(VARIANTS)}, or groups {sorted(GROUPS)}")
            if WORKLOADS[name] not in chosen:
                chosen.append(WORKLOADS[name])
    if not chosen:
        raise ValueError("--workloads: no workload selected")
    return chosen


def shrink(workload: Workload, length_divisor: int = 64, head_divisor: int = 8) -> Workload:
    """A tiny version of ``workload`` for the CPU dry run: lengths // length_divisor and
    heads // head_divisor (each at least 1); name, masking and head dim stay."""
    return replace(workload,
                   lengths=tuple(max(1, n // length_divisor) for n in workload.lengths),
                   heads_q=max(1, workload.heads_q // head_divisor),
                   heads_kv=max(1, workload.heads_kv // head_divisor))


@dataclass(frozen=True)
class Case:
    """A workload with its inputs, drawn once (bf16 random normal, never zeros)."""

    workload: Workload
    inputs: PackedInputs


def make_case(workload: Workload, device: "str | torch.device") -> Case:
    inputs = make_packed_inputs(workload.lengths, workload.heads_q, workload.heads_kv, workload.head_dim,
                                dtype=torch.bfloat16, seed=workload.seed, device=device)
    return Case(workload, inputs)
