"""GPU check of the bf16 recipe on the kernels (issue 23), under 4 minutes on one H200:
1. the gpu tests selected by -k bf16 (Gluon kernels bitwise against their Triton twins, the
   kernels and the training call against the emulator), in 4 parallel pytest shards;
2. the training call (forward + backward, CUDA-graphed) on the six causal workloads of
   `flamia bench`, flamia:bf16 next to flamia:mxfp8 and FA2 varlen (BF16), as a table.

    python3 benchmarks/bf16_check.py [--skip-tests] [--skip-timing]
"""
import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's flamia, not an installed one

TEST_FILES = ["tests/test_kernel_fwd.py", "tests/test_kernel_bwd.py", "tests/test_kernel_ops.py", "tests/test_api.py"]
PROVIDERS = ("flamia:mxfp8", "flamia:bf16", "fa2:bf16")


def run_tests() -> int:
    t0 = time.time()
    try:
        rc = subprocess.run([sys.executable, "benchmarks/gpu_tests.py", *TEST_FILES, "-k",
                             "bf16 or backend_resolution"], cwd=ROOT, timeout=170).returncode
    except subprocess.TimeoutExpired:
        rc = 124
    print(f"gpu tests: exit {rc} in {time.time() - t0:.0f} s", flush=True)
    return rc


def run_timing() -> None:
    import torch

    from flamia.bench.providers import registry
    from flamia.bench.timing import capture_graph, cuda_clock
    from flamia.bench.workloads import GROUPS, WORKLOADS, make_case

    providers = {p.key: p for p in registry()}
    rows = []
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for name in GROUPS["causal"]:
            case = make_case(WORKLOADS[name], "cuda")
            times = {}
            for key in PROVIDERS:
                p = providers[key]
                why = p.unsupported(case.workload, "train")
                if why:
                    times[key] = why
                    continue
                try:
                    job = capture_graph(p.build(case, "train"))
                    cuda_clock(job, 3)
                    times[key] = min(cuda_clock(job, 10) for _ in range(3))
                except Exception as exc:  # report and go on: the table is the point
                    times[key] = f"{type(exc).__name__}: {str(exc)[:80]}"
                torch.cuda.synchronize()
            rows.append((name, times))
            print(name, {k: (f"{v:.3f} ms" if isinstance(v, float) else v) for k, v in times.items()}, flush=True)
            del case
            torch.cuda.empty_cache()
    print("\n| workload | " + " | ".join(PROVIDERS) + " | bf16 vs FA2 | bf16 / mxfp8 |")
    print("|---" * (len(PROVIDERS) + 3) + "|")
    for name, t in rows:
        cells = [f"{t[k]:.3f}" if isinstance(t[k], float) else "n/a" for k in PROVIDERS]
        mx, bf16, fa2 = (t[k] for k in PROVIDERS)
        vs_fa2 = f"{fa2 / bf16:.2f}x" if isinstance(fa2, float) and isinstance(bf16, float) else "n/a"
        vs_mx = f"{bf16 / mx:.2f}" if isinstance(mx, float) and isinstance(bf16, float) else "n/a"
        print(f"| {name} | " + " | ".join(cells) + f" | {vs_fa2} | {vs_mx} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--skip-timing", action="store_true")
    args = ap.parse_args()
    rc = 0 if args.skip_tests else run_tests()
    if not args.skip_timing:
        run_timing()
    return rc


if __name__ == "__main__":
    sys.exit(main())
