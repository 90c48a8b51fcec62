"""GPU check of the mixed NVFP4 route on the kernels (issue 23), a few minutes on one H200:
1. the gpu tests selected by -k "nvfp4 or score_codes or helpers" (the Gluon kernels bitwise
   against their Triton twins, the kernels and the training call against the emulator, the
   score codes against their reference);
2. the training call (forward + backward, CUDA-graphed, best of 3 x 10, each provider alone)
   on the six causal workloads of `flamia bench`: flamia nvfp4 next to mxfp8, bf16 and FA2
   varlen (BF16), as a table.

    python3 benchmarks/nvfp4_check.py [--skip-tests] [--skip-timing]
"""
import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's flamia, not an installed one

TEST_FILES = ["tests/test_kernel_fwd.py", "tests/test_kernel_bwd.py", "tests/test_kernel_quantize_fp4.py",
              "tests/test_kernel_ops.py", "tests/test_replay.py"]
PROVIDERS = ("flamia:mxfp8", "flamia:nvfp4", "flamia:bf16", "fa2:bf16")


def run_tests() -> int:
    t0 = time.time()
    try:
        rc = subprocess.run([sys.executable, "benchmarks/gpu_tests.py", *TEST_FILES, "-k",
                             "nvfp4 or score_codes or helpers"], cwd=ROOT, timeout=300).returncode
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
    print("\ntraining call, CUDA-graphed, ms\n\n| workload | " + " | ".join(PROVIDERS)
          + " | nvfp4 vs FA2 | nvfp4 / mxfp8 |")
    print("|---" * (len(PROVIDERS) + 3) + "|")
    for name, t in rows:
        cells = [f"{t[k]:.3f}" if isinstance(t[k], float) else "n/a" for k in PROVIDERS]
        mx, nv, fa2 = (t[k] for k in ("flamia:mxfp8", "flamia:nvfp4", "fa2:bf16"))
        vs_fa2 = f"{fa2 / nv:.2f}x" if isinstance(fa2, float) and isinstance(nv, float) else "n/a"
        vs_mx = f"{nv / mx:.2f}" if isinstance(mx, float) and isinstance(nv, float) else "n/a"
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
