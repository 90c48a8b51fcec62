"""Host overhead of one eager training call (forward + backward), next to its CUDA-graphed
time, for flamia, FlashAttention-2 (aten) and, where flash_attn.cute imports (the FA4 wheel
bundle, benchmarks/README.md), FlashAttention-4; each provider alone.

    PYTHONPATH=. python3 benchmarks/host_overhead.py [--workloads eq4x4k,...] [--out DIR]

Per workload and provider:
- graphed ms: the call captured in a CUDA graph, replayed (GPU time per call);
- eager ms: the call issued back to back without a graph (what a training loop sees);
- host ms: CPU time to issue one call while the GPU is kept busy by a sleep kernel, so the
  host never waits for the GPU (the call's Python and launch cost alone);
- launches: GPU kernels per call (torch.profiler).
"autograd floor" is a Python ``autograd.Function`` that copies q forward and dO backward: the
host cost any Python autograd node pays on this machine. Writes results.json, results.md and
results.png under --out (default benchmarks/results/<date>-<gpu>-host); ``--cprofile N`` also
writes cprofile.txt, where the host time of N eager flamia calls on the first workload goes.
"""
import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import time

import torch

from flamia.bench.jobs import autograd_job
from flamia.bench.peers_fa4 import fa4_job
from flamia.bench.peers_torch import fa2_job
from flamia.bench.timing import cuda_clock
from flamia.bench.workloads import WORKLOADS, make_case
from flamia.workload import as_attention

DEFAULT = "eq4x4k,eq8x8k,skew8k+32x256,skew8k+224x256,logu11-16k,logu29-64k"


def providers(case):
    i, causal = case.inputs, case.workload.causal
    attn = as_attention("mxfp8", "triton")

    def flamia_call(q, k, v):
        return attn(q, k, v, i.cu_seqlens, i.cu_seqlens, i.max_seqlen, i.max_seqlen, causal)[0]

    jobs = {"flamia mxfp8": autograd_job(flamia_call, i, "train"), "FA2": fa2_job(case, "train"),
            "autograd floor": autograd_job(lambda q, k, v: _Copy.apply(q, k, v), i, "train")}
    try:
        jobs["FA4"] = fa4_job(case, "train")
    except ImportError:  # no FA4 bundle on this machine
        pass
    return jobs


class _Copy(torch.autograd.Function):
    """out = q.clone(); dq = dO.clone(), dk and dv allocated: one launch each way."""

    @staticmethod
    def forward(ctx, q, k, v):
        ctx.kv = k.shape, v.shape
        return q.clone()

    @staticmethod
    def backward(ctx, do):
        k_shape, v_shape = ctx.kv
        return do.clone(), do.new_empty(k_shape), do.new_empty(v_shape)


def graphed_ms(job, calls: int) -> float:
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        job()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            job()
        torch.cuda.synchronize()
        return statistics.median(cuda_clock(graph.replay, calls) for _ in range(3))


def host_ms(job, calls: int) -> float:
    """CPU time per issued call, the GPU busy all the while (a sleep kernel queued first):
    the median of 5 samples of ``calls`` calls."""
    samples = []
    for _ in range(5):
        torch.cuda.synchronize()
        torch.cuda._sleep(2_000_000_000)  # about a second of GPU cycles ahead of the calls
        t0 = time.perf_counter()
        for _ in range(calls):
            job()
        samples.append((time.perf_counter() - t0) * 1e3 / calls)
        torch.cuda.synchronize()
    return statistics.median(samples)


def launches(job) -> int:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        job()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def measure(names: list[str]) -> list[dict]:
    rows = []
    for name in names:
        case = make_case(WORKLOADS[name], "cuda")
        for provider, job in providers(case).items():
            for _ in range(3):
                job()  # compile and warm up
            torch.cuda.synchronize()
            eager = statistics.median(cuda_clock(job, 10) for _ in range(3))
            row = dict(workload=name, provider=provider, graphed_ms=graphed_ms(job, 10), eager_ms=eager,
                       host_ms=host_ms(job, 30), launches=launches(job))
            row["eager_over_graphed"] = row["eager_ms"] / row["graphed_ms"]
            rows.append(row)
            print(f"{name:16s} {provider:14s} graphed {row['graphed_ms']:8.3f} eager {eager:8.3f} "
                  f"({row['eager_over_graphed']:.3f}x) host {row['host_ms']:.3f} ms, {row['launches']} launches",
                  flush=True)
        del case
        torch.cuda.empty_cache()
    return rows


def cprofile_text(name: str, calls: int) -> str:
    """cProfile of ``calls`` eager flamia training calls on workload ``name``, the GPU kept
    busy: the top functions by own time and by cumulative time."""
    case = make_case(WORKLOADS[name], "cuda")
    job = providers(case)["flamia mxfp8"]
    for _ in range(3):
        job()
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        job()
    profiler.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    text.write(f"{calls} eager training calls, flamia mxfp8, {name}\n")
    stats.sort_stats("tottime").print_stats(30)
    stats.sort_stats("cumulative").print_stats(40)
    return text.getvalue()


def write(rows: list[dict], out: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out, exist_ok=True)
    header = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                  triton=__import__("triton").__version__, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(dict(header=header, records=rows), f, indent=1)
    lines = [f"# Host overhead of the training call ({header['device']}, {header['date']}, torch {header['torch']}, "
             f"Triton {header['triton']})", "",
             "| workload | provider | graphed ms | eager ms | eager / graphed | host ms per call | launches |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['workload']} | {r['provider']} | {r['graphed_ms']:.3f} | {r['eager_ms']:.3f} | "
              f"{r['eager_over_graphed']:.3f} | {r['host_ms']:.3f} | {r['launches']} |" for r in rows]
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    names = list(dict.fromkeys(r["workload"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for provider in dict.fromkeys(r["provider"] for r in rows):
        mine = [r for r in rows if r["provider"] == provider]
        axes[0].plot(names, [r["host_ms"] for r in mine], "o-", label=provider)
        axes[1].plot(names, [r["eager_over_graphed"] for r in mine], "o-", label=provider)
    axes[0].set_ylabel("host ms per eager call")
    axes[1].set_ylabel("eager / graphed time")
    for ax in axes:
        ax.tick_params(axis="x", rotation=30)
        ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "results.png"), dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default=DEFAULT)
    parser.add_argument("--out", default=None)
    parser.add_argument("--cprofile", type=int, default=0, metavar="N",
                        help="also profile N eager flamia calls on the first workload (cprofile.txt)")
    args = parser.parse_args()
    names = args.workloads.split(",")
    gpu = torch.cuda.get_device_name().split()[-1].lower()
    out = args.out or os.path.join("benchmarks", "results", time.strftime("%Y-%m-%d") + f"-{gpu}-host")
    if args.cprofile:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "cprofile.txt"), "w") as f:
            f.write(cprofile_text(names[0], args.cprofile))
    write(measure(names), out)


if __name__ == "__main__":
    main()
