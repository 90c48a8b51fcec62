"""GPU check of one recipe on the kernels (issue 23), a few minutes on one H200:
1. the recipe's gpu tests (the Gluon kernels bitwise against their Triton twins, the kernels and
   the training call against the emulator, replay, backend resolution), in parallel shards;
2. its training call (forward + backward, CUDA-graphed, best of 3 x 10, each provider alone)
   on the six causal workloads of `flamia bench`, next to flamia:mxfp8 and FA2 varlen (BF16),
   as a table, and with --out as results.json and results.md there (written after each
   workload, so a run cut short keeps what it measured).

    python3 benchmarks/recipe_check.py --recipe {bf16,nvfp4,fp4} [--skip-tests] [--skip-timing] [--out DIR]
"""
import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's flamia, not an installed one

TEST_FILES = ["tests/test_kernel_fwd.py", "tests/test_kernel_bwd.py", "tests/test_kernel_ops.py", "tests/test_api.py",
              "tests/test_replay.py", "tests/test_kernel_quantize_fp4.py", "tests/test_kernel_quantize_fp4_operands.py",
              "tests/test_nonfinite.py"]
# pytest -k per recipe: the tests named after it, and those of its pieces named otherwise
SELECTION = {"bf16": "bf16 or backend_resolution", "nvfp4": "nvfp4 or score_codes or backend_resolution",
             "fp4": "(fp4 and not nvfp4) or backend_resolution"}


def run_tests(recipe: str) -> int:
    t0 = time.time()
    try:
        rc = subprocess.run([sys.executable, "benchmarks/gpu_tests.py", *TEST_FILES, "-k", SELECTION[recipe]],
                            cwd=ROOT, timeout=300).returncode
    except subprocess.TimeoutExpired:
        rc = 124
    print(f"gpu tests: exit {rc} in {time.time() - t0:.0f} s", flush=True)
    return rc


def _table(recipe: str, keys: tuple, rows: list) -> str:
    lines = ["| workload | " + " | ".join(keys) + f" | {recipe} vs FA2 | {recipe} / mxfp8 |",
             "|---" * (len(keys) + 3) + "|"]
    for name, t in rows:
        cells = [f"{t[k]:.3f}" if isinstance(t[k], float) else "n/a" for k in keys]
        mx, own, fa2 = (t[k] for k in keys)
        vs_fa2 = f"{fa2 / own:.2f}x" if isinstance(fa2, float) and isinstance(own, float) else "n/a"
        vs_mx = f"{own / mx:.2f}" if isinstance(mx, float) and isinstance(own, float) else "n/a"
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {vs_fa2} | {vs_mx} |")
    return "\n".join(lines)


def _write(out: Path, recipe: str, keys: tuple, rows: list) -> None:
    import torch
    import triton

    out.mkdir(parents=True, exist_ok=True)
    head = {"recipe": recipe, "mode": "train", "graphed": True, "protocol": "best of 3 x 10 calls, each provider alone",
            "device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    records = [{"workload": name, "provider": k, **({"ms": v} if isinstance(v, float) else {"why": v})}
               for name, t in rows for k, v in t.items()]
    (out / "results.json").write_text(json.dumps({**head, "records": records}, indent=1))
    (out / "results.md").write_text(f"training call, CUDA-graphed, ms ({head['device']}, {head['date']})\n\n"
                                    + _table(recipe, keys, rows) + "\n")


def run_timing(recipe: str, out: "Path | None") -> None:
    import torch

    from flamia.bench.providers import registry
    from flamia.bench.timing import capture_graph, cuda_clock
    from flamia.bench.workloads import GROUPS, WORKLOADS, make_case

    keys = ("flamia:mxfp8", f"flamia:{recipe}", "fa2:bf16")
    providers = {p.key: p for p in registry()}
    rows = []
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for name in GROUPS["causal"]:
            case = make_case(WORKLOADS[name], "cuda")
            times = {}
            for key in keys:
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
            if out is not None:
                _write(out, recipe, keys, rows)
            del case
            torch.cuda.empty_cache()
    print("\ntraining call, CUDA-graphed, ms\n\n" + _table(recipe, keys, rows))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recipe", required=True, choices=sorted(SELECTION))
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--skip-timing", action="store_true")
    ap.add_argument("--out", type=Path, help="also write results.json and results.md here")
    args = ap.parse_args()
    rc = 0 if args.skip_tests else run_tests(args.recipe)
    if not args.skip_timing:
        run_timing(args.recipe, args.out)
    return rc


if __name__ == "__main__":
    sys.exit(main())
