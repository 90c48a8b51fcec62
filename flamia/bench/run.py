"""``flamia bench``: time flamia's recipes against its peers on packed-document workloads.

    flamia bench                          every provider, the six causal workloads, train/fwd/bwd
    flamia bench --workloads logu29-64k,gqa --providers flamia:mxfp8,cudnn --modes train
    flamia bench --modes memory           peak memory of one training call on logu29-64k
    flamia bench --dry-run                CPU check: tiny workloads, flamia's emulator only
    flamia bench --merge a/results.json b/results.json

Results go to benchmarks/results/<date>-<device>/ (relative to the working directory)
unless --out says otherwise; a dry run writes to a fresh temporary directory.
See benchmarks/README.md for the protocol and the FLOP model.
"""
import argparse
import contextlib
import dataclasses
import gc
import sys
import tempfile
import time
from pathlib import Path

import torch

from . import environment, report
from .flops import tflops_per_s
from .jobs import MODES
from .providers import Provider, registry, select_providers
from .report import Record
from .timing import (DRY_RUN, Clock, Job, Protocol, capture_graph, cuda_clock, error_reason, host_clock,
                     paired_rounds, peak_memory_gb)
from .workloads import WORKLOADS, Case, Workload, make_case, select_workloads, shrink

MEMORY_WORKLOAD = "logu29-64k"
ALL_MODES = (*MODES, "memory")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="flamia bench", description="Time flamia's recipes against peer attention kernels on packed-document "
                                         "workloads (benchmarks/README.md).")
    parser.add_argument("--workloads", default="causal",
                        help="comma-separated workload names and groups (causal, noncausal, gqa, d64, all)")
    parser.add_argument("--providers", default="all",
                        help="'all', or comma-separated keys (cudnn:fp8) or names (cudnn)")
    parser.add_argument("--modes", default="train,fwd,bwd", help=f"comma-separated, among {','.join(ALL_MODES)}")
    parser.add_argument("--out", help="output directory (default: benchmarks/results/<date>-<device>)")
    parser.add_argument("--dry-run", action="store_true",
                        help="CPU: workloads shrunk (lengths // 64, heads // 8), flamia's reference providers, "
                             "one round, no CUDA graphs; writes to a temporary directory unless --out")
    parser.add_argument("--peek", action="store_true", help="print the markdown tables")
    parser.add_argument("--no-graphs", action="store_true", help="time every call eagerly (debugging)")
    parser.add_argument("--alone", action="store_true",
                        help="time each provider's rounds back to back instead of interleaving them with the "
                             "other providers' (their neighbours move the times: docs/PERFORMANCE.md)")
    parser.add_argument("--merge", nargs="+", metavar="JSON", help="merge the results.json of several runs")
    args = parser.parse_args(argv)
    try:
        args.modes = _modes(args.modes)
        args.workloads = select_workloads(args.workloads)
        args.providers = select_providers(registry(args.dry_run), args.providers)
    except ValueError as exc:
        parser.error(str(exc))
    return args


def _modes(spec: str) -> list[str]:
    modes = [m.strip() for m in spec.split(",") if m.strip()]
    unknown = [m for m in modes if m not in ALL_MODES]
    if unknown or not modes:
        raise ValueError(f"--modes: unknown {unknown or spec!r}; choose among {list(ALL_MODES)}")
    return modes


def _record(provider: Provider, workload: Workload, mode: str, **values) -> Record:
    return Record(workload.name, provider.name, provider.recipe, mode, provider.label,
                  emulated=provider.emulated, **values)


def _release(device: str) -> None:
    """Return the memory of dropped jobs (and their graph pools) before the next ones."""
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def _prepare(provider: Provider, case: Case, mode: str, protocol: Protocol) -> tuple[Job, "str | None"]:
    """The provider's job, captured in a CUDA graph where it allows; with a note when not."""
    job = provider.build(case, mode)
    if not protocol.graphs:
        return job, None
    if provider.eager_why:
        return job, f"eager: {provider.eager_why}"
    try:
        return capture_graph(job), None
    except Exception as exc:
        return job, f"eager: CUDA graph capture failed ({error_reason(exc)})"


def time_row(case: Case, mode: str, providers: list[Provider], device: str, protocol: Protocol,
             clock: Clock) -> list[Record]:
    """One table row: every provider on the case's workload in ``mode``, timed together."""
    workload = case.workload
    records, jobs, notes = {}, {}, {}
    for provider in providers:
        why = provider.unsupported(workload, mode)
        if why is None:
            try:
                jobs[provider.key], notes[provider.key] = _prepare(provider, case, mode, protocol)
            except Exception as exc:
                why = error_reason(exc)
                _release(device)
        if why is not None:
            records[provider.key] = _record(provider, workload, mode, why=why)
    timings, errors = paired_rounds(jobs, clock, protocol)
    for provider in (p for p in providers if p.key in jobs):
        if provider.key in errors:
            records[provider.key] = _record(provider, workload, mode, why=errors[provider.key])
            continue
        timing = timings[provider.key]
        records[provider.key] = _record(provider, workload, mode, ms=timing.ms,
                                        tflops=tflops_per_s(workload, mode, timing.ms), spread=timing.spread,
                                        note=notes[provider.key])
    del jobs
    _release(device)
    print(f"[{mode}] {workload.name}: {len(timings)} timed, {len(providers) - len(timings)} n/a", file=sys.stderr)
    return [records[p.key] for p in providers]


def memory_rows(workload: Workload, providers: list[Provider], device: str) -> list[Record]:
    """Peak memory of one eager training call of each provider on ``workload``."""
    if device != "cuda":
        return [_record(p, workload, "memory", why="needs CUDA") for p in providers]
    case = make_case(workload, device)
    records = []
    for provider in providers:
        why = provider.unsupported(workload, "train")
        if why is None:
            try:
                peak = peak_memory_gb(lambda: provider.build(case, "train"))
                records.append(_record(provider, workload, "memory", peak_gb=peak))
            except Exception as exc:
                why = error_reason(exc)
            _release(device)
        if why is not None:
            records.append(_record(provider, workload, "memory", why=why))
    return records


@contextlib.contextmanager
def _bench_stream(device: str):
    """One side stream for the whole run: graphs cannot capture the default stream, and a
    backward captured later must run on the stream its forward was recorded on."""
    if device != "cuda":
        yield
        return
    with torch.cuda.stream(torch.cuda.Stream()):
        yield


def _workloads(args: argparse.Namespace) -> tuple[list[Workload], "Workload | None"]:
    """The timed workloads and the memory mode's (None without it), shrunk for a dry run."""
    scaled = shrink if args.dry_run else (lambda w: w)
    memory = scaled(WORKLOADS[MEMORY_WORKLOAD]) if "memory" in args.modes else None
    timed = [scaled(w) for w in args.workloads] if set(args.modes) & set(MODES) else []
    return timed, memory


def _measure(args: argparse.Namespace, argv: list[str]) -> tuple[dict, list[Record]]:
    """Run the selected cells; returns the report header and the records."""
    device = "cpu" if args.dry_run else "cuda"
    protocol = DRY_RUN if args.dry_run else Protocol(graphs=not args.no_graphs)
    protocol = dataclasses.replace(protocol, interleave=not args.alone)
    clock = host_clock if args.dry_run else cuda_clock
    timed, memory = _workloads(args)
    described = {w.name: dataclasses.asdict(w) for w in [*timed, *([memory] if memory else [])]}
    header = environment.header(device, argv, dataclasses.asdict(protocol), described)
    started = time.monotonic()
    records = []
    with _bench_stream(device):
        for workload in timed:
            case = make_case(workload, device)  # inputs drawn once per workload
            for mode in (m for m in args.modes if m in MODES):
                records += time_row(case, mode, args.providers, device, protocol, clock)
            del case  # free this workload's inputs before the next ones are drawn
        if memory is not None:
            records += memory_rows(memory, args.providers, device)
    header["elapsed_s"] = round(time.monotonic() - started, 1)  # the README quotes wall times
    return header, records


def main(argv: "list[str] | None" = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.merge:
        header, records = report.merge([report.load(Path(p)) for p in args.merge])
        header["command"] = " ".join(["flamia", "bench", *argv])
    elif args.dry_run or torch.cuda.is_available():
        header, records = _measure(args, argv)
    else:
        print("flamia bench: no CUDA device; use --dry-run for the CPU check", file=sys.stderr)
        return 2
    # Providers of the registry with no record: named in the report, so no column is a silent gap.
    present = {(r.provider, r.recipe) for r in records}
    header["not_run"] = [p.label for p in registry(args.dry_run) if (p.name, p.recipe) not in present]
    if args.out:
        out = Path(args.out)
    elif args.dry_run:
        out = Path(tempfile.mkdtemp(prefix="flamia-bench-"))
    else:
        out = Path("benchmarks") / "results" / environment.results_dirname(header)
    paths = report.write_report(out, header, records)
    if args.peek:
        print(report.markdown(header, records))
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
