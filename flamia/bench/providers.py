"""The registry of attention implementations the suite times: flamia's recipes and its peers.

Each provider declares what it cannot run as rules (a mode, unequal lengths, GQA, a head
dim), each with the reason printed in its "n/a: why" cell, and how to tell whether it is
installed. Peers from the two wheel bundles (shared/wheels/README.md) report "not
installed" until their bundle is on the path, so every table keeps every column.

Keys are "name:recipe" (e.g. "cudnn:fp8"); ``select_providers`` also takes a bare name for
all recipes of a provider, and flamia's recipes with boolean Recipe fields set
("flamia:mxfp8+bf16_scores", "flamia:mxfp8+p_sum_codes=False").
"""
import functools
import importlib
from dataclasses import dataclass, fields
from typing import Callable

import torch

from ..api import flash_attn_varlen_func
from ..recipes import RECIPE_NAMES, Recipe, resolve_recipe
from ..validation import KERNEL_RECIPES
from .jobs import autograd_job
from .peers_cudnn import cudnn_bf16_job, cudnn_fp8_job
from .peers_fa4 import fa4_job
from .peers_inference import flashinfer_job, sage1_job
from .peers_torch import fa2_job, flex_job, sdpa_nested_job
from .timing import Job
from .workloads import Case, Workload

BUNDLE_CUDNN_FLASHINFER = "flashinfer074_cudnnfe_py312.tar.xz"
BUNDLE_FA4 = "fa4_cutlass_cu13_py312.tar.xz"


@dataclass(frozen=True)
class Rule:
    """A cell is "n/a: why" when ``applies(workload, mode)``."""

    why: str
    applies: Callable[[Workload, str], bool]


def forward_only(why: str) -> Rule:
    return Rule(why, lambda w, mode: mode != "fwd")


def equal_lengths_only(modes: set[str], why: str) -> Rule:
    return Rule(why, lambda w, mode: mode in modes and not w.equal)


def no_gqa(why: str) -> Rule:
    return Rule(why, lambda w, mode: w.gqa)


def head_dims_only(dims: tuple[int, ...], modes: set[str], why: str) -> Rule:
    return Rule(why, lambda w, mode: mode in modes and w.head_dim not in dims)


# The emulator pads every document to the longest one and steps through key tiles with torch
# ops over the whole padded batch, so its time and memory follow documents x longest^2, and
# an emulated cell measures no kernel: the suite times it where that is at most 2^30 (eq4x4k,
# eq8x8k, logu11-16k) and names the other workloads, so that a run stays within a device call.
EMULATED_MAX_PADDED_PAIRS = 1 << 30


def emulator_size(why: str) -> Rule:
    return Rule(why, lambda w, mode: len(w.lengths) * max(w.lengths) ** 2 > EMULATED_MAX_PADDED_PAIRS)


@dataclass(frozen=True)
class Provider:
    """name, recipe: the record's keys. label: the table's column. build(case, mode): the
    timed job. available(): None, or why it cannot run here. eager_why: None when its
    calls may be captured in a CUDA graph, else why they run eagerly. emulated: its times
    measure an emulator, not a kernel (never bold, never a peer)."""

    name: str
    recipe: str
    label: str
    build: Callable[[Case, str], Job]
    available: Callable[[], "str | None"]
    rules: tuple[Rule, ...] = ()
    eager_why: "str | None" = None
    emulated: bool = False

    @property
    def key(self) -> str:
        return f"{self.name}:{self.recipe}"

    @property
    def peer(self) -> bool:
        return self.name != "flamia"

    def unsupported(self, workload: Workload, mode: str) -> "str | None":
        """None when the cell can be timed, else its reason."""
        for rule in self.rules:
            if rule.applies(workload, mode):
                return rule.why
        return self.available()


def _requires(*checks: Callable[[], "str | None"]) -> Callable[[], "str | None"]:
    """The first failing check's reason, computed once."""
    return functools.cache(lambda: next((why for why in (check() for check in checks) if why), None))


def _cuda() -> "str | None":
    return None if torch.cuda.is_available() else "needs CUDA"


def _module(name: str, source: str) -> Callable[[], "str | None"]:
    def check():
        try:
            importlib.import_module(name)
        except Exception as exc:  # a broken install reads as not installed, with its reason
            return f"not installed: {name} ({source}; {type(exc).__name__})"
        return None
    return check


def _capability(*majors: int) -> Callable[[], "str | None"]:
    def check():
        major, minor = torch.cuda.get_device_capability()
        wanted = "/".join(f"sm_{m}x" for m in majors)
        return None if major in majors else f"needs {wanted}, got sm_{major}{minor}"
    return check


def _flash_sdp() -> "str | None":
    built = getattr(torch.backends.cuda, "is_flash_attention_available", lambda: True)()
    return None if built else "torch built without FlashAttention"


_RECIPE_FLAGS = tuple(f.name for f in fields(Recipe) if f.type in (bool, "bool", bool | None, "bool | None"))


def flamia_recipe(spec: str) -> Recipe:
    """A named recipe with boolean fields set: "mxfp8+bf16_scores" switches one on,
    "mxfp8+p_sum_codes=False" sets one off."""
    name, *flags = spec.split("+")
    values = dict((f.split("=", 1) + ["True"])[:2] for f in flags)
    unknown = [f for f, v in values.items() if f not in _RECIPE_FLAGS or v not in ("True", "False")]
    if unknown:
        raise ValueError(f"--providers: {spec!r} sets {unknown}; the Recipe flags are {list(_RECIPE_FLAGS)}, "
                         "each alone (True) or as flag=True or flag=False")
    return resolve_recipe(name).with_(**{f: v == "True" for f, v in values.items()})


def _flamia(recipe: str, backend: str) -> Provider:
    """flamia.flash_attn_varlen_func with ``recipe`` (``flamia_recipe``) on ``backend``; the
    reference backend is the tile-faithful emulator, so its times are labelled emulated."""
    resolved = flamia_recipe(recipe)

    def build(case: Case, mode: str) -> Job:
        i = case.inputs

        def attention(q, k, v):
            return flash_attn_varlen_func(q, k, v, i.cu_seqlens, i.cu_seqlens, i.max_seqlen, i.max_seqlen,
                                          causal=case.workload.causal, recipe=resolved, backend=backend)

        return autograd_job(attention, i, mode)

    emulated = backend == "reference"
    suffix = "" if not emulated else (" (emulated)" if resolved.name in ("mxfp8", "bf16") else " (emulated on Hopper)")
    rules = (emulator_size("emulated: timed where documents x longest^2 <= 2^30 (the emulator pads to the longest)"),)
    name, *flags = recipe.split("+")
    return Provider("flamia", recipe, f"flamia {name.upper()}{''.join('+' + f for f in flags)}{suffix}", build,
                    _requires(_cuda) if backend == "triton" else _requires(),
                    rules=rules if emulated else (),
                    eager_why="the emulator synchronises with the host" if emulated else None,
                    emulated=emulated)


def _peers() -> tuple[Provider, ...]:
    cudnn = _requires(_cuda, _module("cudnn", f"bundle {BUNDLE_CUDNN_FLASHINFER}"))
    flashinfer = _module("flashinfer", f"bundle {BUNDLE_CUDNN_FLASHINFER}")
    prefill_only = forward_only("prefill kernel: forward only")
    return (
        Provider("fa2", "bf16", "FA2 varlen (aten)", fa2_job, _requires(_cuda, _flash_sdp)),
        Provider("sdpa-nested", "bf16", "SDPA nested", sdpa_nested_job, _requires(_cuda),
                 rules=(no_gqa("nested-tensor SDPA: no GQA"),)),
        Provider("flex", "bf16", "FlexAttention", flex_job, _requires(_cuda)),
        Provider("cudnn", "bf16", "cuDNN BF16", cudnn_bf16_job, cudnn),
        Provider("cudnn", "fp8", "cuDNN FP8", cudnn_fp8_job, cudnn, rules=(
            equal_lengths_only({"bwd", "train"}, "cuDNN FP8 backward on Hopper: dense, equal lengths only"),
            head_dims_only((128,), {"bwd", "train"}, "cuDNN FP8 backward on Hopper: d=128 only"))),
        Provider("flashinfer", "bf16", "FlashInfer BF16", functools.partial(flashinfer_job, fp8=False),
                 _requires(_cuda, flashinfer), rules=(prefill_only,)),
        Provider("flashinfer", "fp8", "FlashInfer FP8", functools.partial(flashinfer_job, fp8=True),
                 _requires(_cuda, _capability(9), flashinfer), rules=(prefill_only,)),
        Provider("fa4", "bf16", "FA4 BF16", fa4_job,
                 _requires(_cuda, _capability(9, 10, 11), _module("flash_attn.cute", f"bundle {BUNDLE_FA4}"))),
        Provider("sage1", "int8", "SageAttention1", sage1_job,
                 _requires(_cuda, _module("sageattention", "optional, no bundle")),
                 rules=(forward_only("inference kernel: forward only"),
                        equal_lengths_only({"fwd"}, "batched API: equal lengths only"))),
    )


def registry(dry_run: bool = False) -> tuple[Provider, ...]:
    """Every provider, flamia's recipes first. The CPU dry run keeps flamia on the
    reference backend only; on the GPU the recipes the kernels run (mxfp8, nvfp4, fp4, bf16) run them."""
    flamia = tuple(_flamia(recipe, "triton" if recipe in KERNEL_RECIPES and not dry_run else "reference")
                   for recipe in RECIPE_NAMES)
    return flamia if dry_run else flamia + _peers()


def select_providers(providers: tuple[Provider, ...], spec: str) -> list[Provider]:
    """"all", or a comma-separated list of keys ("cudnn:fp8") and names ("cudnn")."""
    tokens = [t.strip() for t in spec.split(",") if t.strip()]
    if tokens == ["all"]:
        return list(providers)
    base = {p.key: p for p in providers}
    variants = tuple(_flamia(t.split(":", 1)[1], "reference" if base[t.split("+")[0]].emulated else "triton")
                     for t in tokens if "+" in t and t.split("+")[0] in base and t.startswith("flamia:"))
    providers = providers + variants
    known = {p.key for p in providers} | {p.name for p in providers}
    unknown = [t for t in tokens if t not in known]
    if unknown or not tokens:
        raise ValueError(f"--providers: unknown {unknown or spec!r}; choose 'all' or among {sorted(known)}")
    return [p for p in providers if p.key in tokens or p.name in tokens]
