"""Check and measure the host path of the eager training call on the GPU (flamia/kernels/launch.py).

    PYTHONPATH=. python3 benchmarks/host_check.py [--workloads eq4x4k,...] [--skip-bench] [--compile-tests] [--no-pytest] [--out DIR]

1. Direct launches (the kept compiled kernels' launchers) against Triton's ordinary launch,
   bit for bit: out, lse, dq, dk, dv on packed documents of odd lengths, with GQA, head dims
   64 and 128, causal and windowed masks; then the fused launches (plan, key and query
   records) against the separate builders they replace (tests/test_kernel_plan.py) and the
   training call against the emulator (tests/test_kernel_ops.py); torch.compile against
   eager (tests/test_compile.py) with --compile-tests (a minute or two more).
2. benchmarks/host_overhead.py's measurement (host ms per call, launches per call, eager
   and graphed ms) on the six workloads, flamia and FA2, and flamia's host time with the
   direct launches switched off on the first workload.
"""
import argparse
import sys
import time

import torch

import flamia
from flamia.kernels import launch

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


KEEP = launch._MAX_KEYS


def plain_launches(enabled: bool) -> None:
    """Switch the kept kernels off (every launch through ``kernel[grid]``) or back on."""
    launch._kept.clear()
    launch._MAX_KEYS = KEEP if enabled else 0


def check_bits(compile_tests: bool, pytest_files: bool) -> bool:
    from flamia.workload import make_packed_inputs
    ok = True
    for lengths, hq, hkv, d, causal, window in CASES:
        inputs = make_packed_inputs(lengths, heads_q=hq, heads_kv=hkv, head_dim=d, seed=sum(lengths), device="cuda")
        plain_launches(False)
        want = call(inputs, causal, window)
        plain_launches(True)
        call(inputs, causal, window)  # keeps the compiled kernels
        kept = len(launch._kept)
        got = call(inputs, causal, window)  # launches them directly
        torch.cuda.synchronize()
        same = [torch.equal(a, b) for a, b in zip(got, want)]
        ok &= all(same) and kept > 0
        print(f"lengths {lengths} Hq {hq} Hkv {hkv} d {d} causal {causal} window {window}: "
              f"{kept} kept kernels, bitwise equal (out, lse, dq, dk, dv) {same}", flush=True)
    if not pytest_files:
        return ok
    import pytest
    tests = ["tests/test_kernel_plan.py", "tests/test_kernel_ops.py"]
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
    plain_launches(False)
    for _ in range(3):
        job()
    print(f"{names[0]:16s} flamia mxfp8, direct launches off: host {host_overhead.host_ms(job, 10):.3f} ms",
          flush=True)
    plain_launches(True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default="eq4x4k,eq8x8k,skew8k+32x256,skew8k+224x256,logu11-16k,logu29-64k")
    parser.add_argument("--skip-bench", action="store_true")
    parser.add_argument("--compile-tests", action="store_true")
    parser.add_argument("--no-pytest", action="store_true", help="bit checks only (the GPU gate runs the test files)")
    parser.add_argument("--out", default=None, help="also write host_overhead.py's results.json/md/png here")
    args = parser.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, Triton {__import__('triton').__version__}",
          flush=True)
    t0 = time.perf_counter()
    ok = check_bits(args.compile_tests, not args.no_pytest)
    print(f"bit checks {'passed' if ok else 'FAILED'} in {time.perf_counter() - t0:.0f} s", flush=True)
    if not args.skip_bench:
        bench(args.workloads.split(","), args.out)
    print(f"total {time.perf_counter() - t0:.0f} s")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
