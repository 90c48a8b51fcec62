"""The timing protocol (paper Appendix D.1).

Each job (one provider's call on one workload and mode) is captured in a CUDA graph where
the provider allows it. The jobs of one table row then run back to back: a discarded
warm-up round, then ``rounds`` paired rounds, in reversed order every other round so that
no job always follows the same neighbour (``Protocol.interleave``; without it each job runs
its rounds alone, back to back). Within a round a job replays enough times to fill
at least ``min_ms`` between two CUDA events, and its time is the mean per replay. A job
reports the median over the rounds and its spread, (max - min) / median.

Everything runs on the caller's current stream, which must not be the default stream when
graphs are captured (``run.py`` opens one side stream for the whole run): forward passes
built outside the timed region then record their autograd state on the stream that later
captures their backward.
"""
import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

Job = Callable[[], object]
Clock = Callable[[Job, int], float]  # (job, replays) -> ms per replay


@dataclass(frozen=True)
class Protocol:
    rounds: int = 3
    warmup_rounds: int = 1
    min_ms: float = 20.0
    graphs: bool = True
    # False: each job runs all its rounds before the next job starts. A job's neighbours move
    # its time: interleaved with FA4, flamia and FA2 run up to 12-15% slower and FA4 faster
    # (docs/PERFORMANCE.md).
    interleave: bool = True


# The CPU dry run only checks that the suite runs end to end: one round, one replay.
DRY_RUN = Protocol(rounds=1, warmup_rounds=0, min_ms=0.0, graphs=False)


@dataclass(frozen=True)
class Timing:
    ms: float
    spread: float
    samples: tuple[float, ...]


def cuda_clock(job: Job, replays: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        job()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / replays


def kernel_times(job: Job, calls: int) -> dict[str, tuple[float, float]]:
    """CUDA time of each kernel a job launches, as torch.profiler records it over ``calls``
    calls after one warm-up call: {kernel name: (ms per call, launches per call)}. Host time
    between launches does not count."""
    from torch.profiler import ProfilerActivity, profile
    job()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            job()
        torch.cuda.synchronize()
    return {e.key: (e.self_device_time_total / calls / 1e3, e.count / calls)
            for e in prof.key_averages() if e.self_device_time_total > 0}


def host_clock(job: Job, replays: int) -> float:
    start = time.perf_counter()
    for _ in range(replays):
        job()
    return (time.perf_counter() - start) * 1e3 / replays


def error_reason(exc: BaseException) -> str:
    """A one-line "error: ..." for a report cell."""
    first_line = (str(exc).strip().splitlines() or [""])[0]
    return f"error: {type(exc).__name__}: {first_line}"[:200]


def _replays(clock: Clock, job: Job, min_ms: float) -> int:
    """Calls per sample to fill ``min_ms``, from a call after a first one: a first eager call
    compiles, records its launch program and allocates, so its time would leave one call
    per sample, and each such sample would hold the host's gap before the GPU's first kernel."""
    if min_ms <= 0:
        return 1
    clock(job, 1)
    return max(1, math.ceil(min_ms / max(clock(job, 1), 1e-6)))


def _schedule(keys: list[str], protocol: Protocol) -> list[tuple[int, str]]:
    """(round index, job key) in the order they run: rounds of every job, in reversed order
    every other round; or, without interleave, each job's rounds back to back."""
    count = protocol.warmup_rounds + protocol.rounds
    if not protocol.interleave:
        return [(index, key) for key in keys for index in range(count)]
    return [(index, key) for index in range(count) for key in (keys if index % 2 == 0 else keys[::-1])]


def paired_rounds(jobs: dict[str, Job], clock: Clock,
                  protocol: Protocol) -> tuple[dict[str, Timing], dict[str, str]]:
    """Time ``jobs`` (key -> job) together. Returns (key -> Timing, key -> error reason);
    a job that raises is dropped from the rest of the rounds with its reason."""
    errors, replays = {}, {}
    for key, job in jobs.items():
        try:
            replays[key] = _replays(clock, job, protocol.min_ms)
        except Exception as exc:
            errors[key] = error_reason(exc)
    samples = {key: [] for key in replays}
    for index, key in _schedule(list(replays), protocol):
        if key in errors:
            continue
        try:
            ms = clock(jobs[key], replays[key])
        except Exception as exc:
            errors[key] = error_reason(exc)
            continue
        if index >= protocol.warmup_rounds:
            samples[key].append(ms)
    timings = {}
    for key, values in samples.items():
        if key not in errors and values:
            median = statistics.median(values)
            timings[key] = Timing(median, (max(values) - min(values)) / median, tuple(values))
    return timings, errors


class GraphedJob:
    """A job captured in a CUDA graph; calling it replays the graph. It holds the job too:
    the tensors the job's closure owns (inputs, output buffers, saved forward state) are
    what the graph reads and writes, so they must live as long as the graph."""

    def __init__(self, job: Job, graph: "torch.cuda.CUDAGraph"):
        self.job, self.graph = job, graph

    def __call__(self) -> None:
        self.graph.replay()


def capture_graph(job: Job, warmup_calls: int = 2) -> GraphedJob:
    """``job`` captured in a CUDA graph on the current stream. The warm-up calls compile,
    autotune and allocate outside the capture."""
    stream = torch.cuda.current_stream()
    if stream == torch.cuda.default_stream():
        raise RuntimeError("capture_graph: run on a side stream (CUDA graphs cannot capture the default stream)")
    for _ in range(warmup_calls):
        job()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        job()
    return GraphedJob(job, graph)


def peak_memory_gb(build: Callable[[], Job]) -> float:
    """Peak memory above what is live before the job is built, over ``build()`` and two
    eager calls, in GB (1e9 bytes), from torch.cuda.max_memory_allocated. Counting from
    before the build charges every provider for the buffers it allocates once and reuses
    (cuDNN's graph outputs), as a training step would hold them; counting from the second
    call alone would charge cuDNN 0 GB."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    job = build()
    job()
    job()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 1e9
