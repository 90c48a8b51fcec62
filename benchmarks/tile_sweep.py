"""Tile configurations of one recipe's kernels, timed: the training call and the forward alone,
CUDA-graphed, best of 3 x 10 calls, per workload, one change at a time from configs.py's tiles.

    PYTHONPATH=. python3 benchmarks/tile_sweep.py --recipe bf16 [--workloads eq8x8k,logu11-16k]
                                                  [--configs JSON_LIST] [--out DIR]

Each configuration replaces the tiles of the recipe's codes (``configs.tile_table``) at the
workload's head dim for its timing, numerics-bearing extents
included: this measures speed only (the emulator and the tests follow configs.py, so a change
worth keeping changes docs/NUMERICS.md's tiles with it). ``sass_offline.py --tiles`` gives a
candidate's shared memory and registers first. Writes results.json and results.md under --out.
"""
import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's flamia

from flamia.bench.jobs import autograd_job  # noqa: E402
from flamia.bench.timing import capture_graph, cuda_clock  # noqa: E402
from flamia.bench.workloads import WORKLOADS, make_case  # noqa: E402
from flamia.kernels import configs, replay  # noqa: E402
from flamia.kernels import ops as kernel_ops  # noqa: E402
from flamia.recipes import RECIPES  # noqa: E402
from flamia.workload import as_attention  # noqa: E402

# Two 4-warp programs per SM need at most ~113 KB of shared memory each (228 KB per SM).
DEFAULT = [{}, {"fwd_block_n": 64, "fwd_stages": 2}, {"fwd_block_n": 64, "fwd_stages": 3},
           {"bwd_block_m": 32}, {"dq_stages": 1}, {"dq_stages": 2}]


def timed(job) -> float:
    graphed = capture_graph(job)
    cuda_clock(graphed, 3)
    return min(cuda_clock(graphed, 10) for _ in range(3))


def measure(recipe: str, name: str, case, change: dict) -> dict:
    """Times ``case`` (workload ``name``) on the recipe's tiles with ``change``, then restores them."""
    d = case.inputs.q.shape[-1]
    table = configs.tile_table(configs.ROUTES[recipe])
    base = table[d]
    table[d] = replace(base, **change)
    kernel_ops._programs = replay.Programs()  # a shape's recorded launches hold the tiles they ran with
    try:
        i, attn = case.inputs, as_attention(RECIPES[recipe], "triton")

        def call(q, k, v):
            return attn(q, k, v, i.cu_seqlens, i.cu_seqlens, i.max_seqlen, i.max_seqlen, case.workload.causal)[0]

        return {"workload": name, "change": change, "train_ms": timed(autograd_job(call, i, "train")),
                "fwd_ms": timed(autograd_job(call, i, "fwd"))}
    except Exception as exc:  # a configuration the kernels refuse: report and go on
        return {"workload": name, "change": change, "error": f"{type(exc).__name__}: {str(exc)[:160]}"}
    finally:
        table[d] = base
        torch.cuda.synchronize()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recipe", required=True, choices=sorted(configs.ROUTES))
    ap.add_argument("--workloads", default="eq8x8k,logu11-16k")
    ap.add_argument("--configs", default=json.dumps(DEFAULT), help="a JSON list of AttnTiles changes")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    rows = []
    with torch.cuda.stream(torch.cuda.Stream()):
        for name in args.workloads.split(","):
            case = make_case(WORKLOADS[name], "cuda")
            for change in json.loads(args.configs):
                rows.append(measure(args.recipe, name, case, change))
                print(json.dumps(rows[-1]), flush=True)
            del case
            torch.cuda.empty_cache()
    head = {"recipe": args.recipe, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": __import__("triton").__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "protocol": "CUDA-graphed, best of 3 x 10 calls"}
    lines = [f"{args.recipe} tiles, ms ({head['device']}, {head['date']}, Triton {head['triton']})", "",
             "| workload | change | train ms | forward ms |", "|---|---|---|---|"]
    for r in rows:
        cells = f"{r['error']} | " if "error" in r else f"{r['train_ms']:.3f} | {r['fwd_ms']:.3f}"
        lines.append(f"| {r['workload']} | {json.dumps(r['change'])} | {cells} |")
    print("\n".join(lines))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps({**head, "records": rows}, indent=1))
        (args.out / "results.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
