"""Where each recipe's training call spends its GPU time: CUDA time per kernel (torch.profiler),
flamia's recipes beside FA2 varlen (aten), per workload.

    PYTHONPATH=. python3 benchmarks/kernel_profile.py [--providers flamia:bf16,...,fa2:bf16]
                                                      [--workloads eq8x8k,logu11-16k] [--calls 3] [--out DIR]

Each provider's training call (``flamia bench``'s job: quantizers, forward and backward, eager)
runs once to warm up, then --calls times under the profiler; a kernel's time is its CUDA time
per call, so host time between launches does not count (``flamia bench`` times the whole call). Writes results.json (header and
records), results.md and results.png (a bar per provider and workload, split by kernel family)
under --out.
"""
import argparse
import dataclasses
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's flamia

from flamia.bench.environment import header  # noqa: E402
from flamia.bench.providers import registry, select_providers  # noqa: E402
from flamia.bench.timing import kernel_times  # noqa: E402
from flamia.bench.workloads import WORKLOADS, make_case  # noqa: E402

# Kernel families by the first pattern that a kernel's name matches (flamia's and FA2's kernels);
# the rest are flamia's quantizers and plan, FA2's D and dQ conversion.
FAMILIES = (("forward", r"attn_fwd|flash_fwd"), ("dK/dV", r"dkdv"), ("dQ", r"^(dq_gluon|_dq_)"),
            ("fused backward", r"flash_bwd_dq_dk_dv"), ("other launches", r""))


def family(kernel: str) -> str:
    """The family (``FAMILIES``) of a kernel's profiler name."""
    return next(name for name, pattern in FAMILIES if re.search(pattern, kernel))


def family_totals(records: list[dict]) -> dict:
    """{(workload, provider): {family: ms per call}}, in the records' order."""
    totals = defaultdict(lambda: defaultdict(float))
    for r in records:
        totals[(r["workload"], r["provider"])][family(r["kernel"])] += r["ms"]
    return totals


def markdown(head: dict, records: list[dict]) -> str:
    lines = [f"# CUDA time per kernel of one training call ({head['device']}, {head['date']})", "",
             f"Command: `{head['command']}`; versions: {head['versions']}.", "",
             "| workload | provider | total ms | " + " | ".join(name for name, _ in FAMILIES) + " |",
             "|---|---|---|" + "---|" * len(FAMILIES)]
    for (workload, provider), by_family in family_totals(records).items():
        cells = [f"{by_family[name]:.3f}" if name in by_family else "" for name, _ in FAMILIES]
        lines.append(f"| {workload} | {provider} | {sum(by_family.values()):.3f} | " + " | ".join(cells) + " |")
    lines += ["", "| workload | provider | kernel | ms | launches |", "|---|---|---|---|---|"]
    lines += [f"| {r['workload']} | {r['provider']} | `{r['kernel'][:90]}` | {r['ms']:.3f} | {r['launches']:g} |"
              for r in records]  # C++ kernel names in full in results.json
    return "\n".join(lines) + "\n"


def plot(records: list[dict], path: Path) -> None:
    totals = family_totals(records)
    bars = list(totals)
    fig = Figure(figsize=(9, 0.4 * len(bars) + 1.5))
    ax = fig.add_subplot()
    left = [0.0] * len(bars)
    for name, _ in FAMILIES:
        widths = [totals[bar].get(name, 0.0) for bar in bars]
        ax.barh(range(len(bars)), widths, left=left, label=name)
        left = [a + b for a, b in zip(left, widths)]
    ax.set_yticks(range(len(bars)), [f"{w} {p}" for w, p in bars])
    ax.invert_yaxis()
    ax.set_xlabel("CUDA ms per training call")
    ax.legend(fontsize="small")
    fig.tight_layout()
    FigureCanvasAgg(fig).print_png(str(path))


def main(argv: "list[str] | None" = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--providers", default="flamia:bf16,flamia:nvfp4,flamia:fp4,flamia:mxfp8,fa2:bf16")
    ap.add_argument("--workloads", default="eq8x8k,logu11-16k")
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results/kernel-profile")
    args = ap.parse_args(argv)
    workloads = {name: WORKLOADS[name] for name in args.workloads.split(",")}
    providers = select_providers(registry(), args.providers)
    records = []
    for name, workload in workloads.items():
        case = make_case(workload, "cuda")
        for provider in providers:
            for kernel, (ms, launches) in kernel_times(provider.build(case, "train"), args.calls).items():
                records.append({"workload": name, "provider": provider.key, "kernel": kernel, "ms": ms,
                                "launches": launches})
            total = sum(r["ms"] for r in records if r["workload"] == name and r["provider"] == provider.key)
            print(f"{name:16s} {provider.key:14s} {total:8.3f} ms", flush=True)
    head = header("cuda", argv, {"calls": args.calls, "warmup_calls": 1},
                  {n: dataclasses.asdict(w) for n, w in workloads.items()})
    head["command"] = " ".join(["python3 benchmarks/kernel_profile.py", *argv])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"header": head, "records": records}, indent=1))
    (out / "results.md").write_text(markdown(head, records))
    plot(records, out / "results.png")
    print(f"wrote {out}/results.json, results.md, results.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
