"""Check and measure the host path of the eager training call on the GPU (flamia/kernels/launch.py,
flamia/kernels/replay.py).

    PYTHONPATH=. python3 benchmarks/host_check.py [--workloads eq4x4k,...] [--skip-bench] [--compile-tests] [--no-pytest] [--split] [--out DIR]

1. The three host paths bit for bit: Triton's ordinary launches, direct launches (the kept
   compiled kernels' launchers) and replayed programs; out, lse, dq, dk, dv on packed
   documents of odd lengths, with GQA, head dims 64 and 128, causal and windowed masks; then
   the fused launches (plan, key and query records) against the separate builders they
   replace (tests/test_kernel_plan.py), the training call against the emulator
   (tests/test_kernel_ops.py) and replay's own tests (tests/test_replay.py); torch.compile
   against eager (tests/test_compile.py) with --compile-tests (a minute or two more).
2. benchmarks/host_overhead.py's measurement (host ms per call, launches per call, eager
   and graphed ms) on the six workloads, and flamia's host time on the first workload with
   replay off, then with direct launches off too.
3. With --split: where an eager call's host time goes on the first workload (each layer's
   inclusive time, timed around it while the GPU is kept busy), next to the floors of that
   host: a trivial autograd.Function of three CUDA tensors, forward and backward, and one
   torch.empty.
"""
import argparse
import sys
import time

import torch

import flamia
from flamia.kernels import launch, replay
from flamia.kernels import ops as kernel_ops

CASES = (  # lengths, heads_q, heads_kv, head_dim, causal, window
    ((1000, 333, 1, 77), 8, 2, 128, True, (-1, -1)),
    ((517, 2048, 3), 16, 16, 64, True, (128, 0)),
    ((4096, 999, 1, 64), 16, 4, 128, False, (256, 256)),
)


def call(inputs, causal, window):
    q, k, v = (x.detach().clone().requires_grad_() for x in (inputs.q, inputs.k, inputs.v))
    cu, n = inputs.cu_seqlens, inputs.max_seqlen
    out, lse = flamia.flash_attn_varlen_func(q, k, v, cu, cu, n, n, causal=causal, window_size=window,
                                             backend="triton", return_lse=True)
    return (out, lse, *torch.autograd.grad(out, (q, k, v), inputs.do))


KEEP, CONVENTION = launch._MAX_KEYS, replay._CONVENTION


def host_path(kept: bool, replayed: bool) -> None:
    """Kept compiled kernels on or off (off: every launch through ``kernel[grid]``), replayed
    programs on or off; both start empty."""
    launch._kept.clear()
    launch._MAX_KEYS = KEEP if kept else 0
    replay._CONVENTION = CONVENTION if replayed else None
    kernel_ops._programs = replay.Programs()


def check_bits(compile_tests: bool, pytest_files: bool) -> bool:
    from flamia.workload import make_packed_inputs
    ok = True
    for lengths, hq, hkv, d, causal, window in CASES:
        inputs = make_packed_inputs(lengths, heads_q=hq, heads_kv=hkv, head_dim=d, seed=sum(lengths), device="cuda")
        host_path(kept=False, replayed=False)
        want = call(inputs, causal, window)
        host_path(kept=True, replayed=False)
        call(inputs, causal, window)  # keeps the compiled kernels
        kept = len(launch._kept)
        direct = call(inputs, causal, window)  # launches them directly
        host_path(kept=True, replayed=True)
        for _ in range(3):  # records, then replays the forward (and records the backward), then both
            replayed = call(inputs, causal, window)
        programs = sum(p is not None for p in kernel_ops._programs.table.values())
        torch.cuda.synchronize()
        same = [torch.equal(a, b) and torch.equal(c, b) for a, c, b in zip(direct, replayed, want)]
        ok &= all(same) and kept > 0 and (programs > 0 or CONVENTION is None)
        print(f"lengths {lengths} Hq {hq} Hkv {hkv} d {d} causal {causal} window {window}: "
              f"{kept} kept kernels, {programs} program(s), direct and replayed bitwise equal to plain "
              f"(out, lse, dq, dk, dv) {same}", flush=True)
    if not pytest_files:
        return ok
    import pytest
    tests = ["tests/test_kernel_plan.py", "tests/test_kernel_ops.py", "tests/test_replay.py"]
    tests += ["tests/test_compile.py"] if compile_tests else []
    rc = pytest.main(["-q", "-p", "no:cacheprovider", *tests])
    print(f"{' '.join(tests)} on the GPU: {'passed' if rc == 0 else 'FAILED'}", flush=True)
    return ok and rc == 0


def bench(names: list[str], out: str | None) -> None:
    sys.path.insert(0, "benchmarks")
    import host_overhead
    from flamia.bench.workloads import WORKLOADS, make_case

    rows = host_overhead.measure(names)
    if out:
        host_overhead.write(rows, out)
    case = make_case(WORKLOADS[names[0]], "cuda")
    job = host_overhead.providers(case)["flamia mxfp8"]
    for label, kept in (("replay off", True), ("replay and direct launches off", False)):
        host_path(kept=kept, replayed=False)
        for _ in range(3):
            job()
        print(f"{names[0]:16s} flamia mxfp8, {label}: host {host_overhead.host_ms(job, 10):.3f} ms", flush=True)
    host_path(kept=True, replayed=True)


class _Timed:
    """Wraps ``owner.name`` to add its inclusive wall time and calls to ``totals[label]``."""

    def __init__(self, totals: dict, label: str, owner, name: str):
        self.owner, self.name, self.inner = owner, name, getattr(owner, name)
        totals[label] = [0.0, 0]
        slot = totals[label]

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return self.inner(*args, **kwargs)
            finally:
                slot[0] += time.perf_counter() - t0
                slot[1] += 1

        setattr(owner, name, timed)

    def undo(self) -> None:
        setattr(self.owner, self.name, self.inner)


class _Trivial(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        ctx.save_for_backward(q, k, v)
        return q.new_empty(q.shape)

    @staticmethod
    def backward(ctx, dout):
        return dout, dout, dout


def split(name: str) -> None:
    """Prints each layer's inclusive host time per eager call of ``name`` and the host's floors."""
    sys.path.insert(0, "benchmarks")
    import host_overhead
    import flamia.ops
    import flamia.workload
    from flamia.bench.workloads import WORKLOADS, make_case

    case = make_case(WORKLOADS[name], "cuda")
    job = host_overhead.providers(case)["flamia mxfp8"]
    for _ in range(3):
        job()
    totals: dict = {}
    wraps = [_Timed(totals, "torch.autograd.grad", torch.autograd, "grad"),
             _Timed(totals, "flash_attn_varlen_func", flamia.workload, "flash_attn_varlen_func"),
             _Timed(totals, "ops.attention", flamia.ops, "attention"),
             _Timed(totals, "forward_eager", kernel_ops, "forward_eager"),
             _Timed(totals, "backward_eager", kernel_ops, "backward_eager"),
             _Timed(totals, "Program.__call__", replay.Program, "__call__"),
             _Timed(totals, "_Step.__call__ (launch)", replay._Step, "__call__")]
    calls = 30
    try:
        whole = host_overhead.host_ms(job, calls)
    finally:
        for w in reversed(wraps):
            w.undo()
    samples = 5 * calls
    print(f"{name}: {whole * 1e3:.1f} us per eager call with the timers (median of 5 x {calls})", flush=True)
    for label, (seconds, count) in totals.items():
        print(f"  {label:28s} {seconds / samples * 1e6:7.1f} us per call ({count / samples:g} per call)")
    q, k, v = (x.detach().clone().requires_grad_() for x in (case.inputs.q, case.inputs.k, case.inputs.v))

    def trivial():
        torch.autograd.grad(_Trivial.apply(q, k, v), (q, k, v), case.inputs.do)

    for _ in range(3):
        trivial()
    print(f"  floor: trivial autograd.Function of q, k, v, forward and backward "
          f"{host_overhead.host_ms(trivial, calls) * 1e3:.1f} us", flush=True)
    print(f"  floor: torch.empty like q {host_overhead.host_ms(lambda: torch.empty_like(q), calls) * 1e3:.1f} us",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default="eq4x4k,eq8x8k,skew8k+32x256,skew8k+224x256,logu11-16k,logu29-64k")
    parser.add_argument("--skip-bench", action="store_true")
    parser.add_argument("--compile-tests", action="store_true")
    parser.add_argument("--no-pytest", action="store_true", help="bit checks only (the GPU gate runs the test files)")
    parser.add_argument("--split", action="store_true", help="where the first workload's host time goes")
    parser.add_argument("--out", default=None, help="also write host_overhead.py's results.json/md/png here")
    args = parser.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, Triton {__import__('triton').__version__}",
          flush=True)
    t0 = time.perf_counter()
    ok = check_bits(args.compile_tests, not args.no_pytest)
    print(f"bit checks {'passed' if ok else 'FAILED'} in {time.perf_counter() - t0:.0f} s", flush=True)
    if not args.skip_bench:
        bench(args.workloads.split(","), args.out)
    if args.split:
        split(args.workloads.split(",")[0])
    print(f"total {time.perf_counter() - t0:.0f} s")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
