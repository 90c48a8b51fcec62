"""The quantizer launches of one training call against the copy bandwidth (issue 23's target:
70% or more), per workload and route, on one GPU.

    PYTHONPATH=. python3 benchmarks/quantizer_bandwidth.py [--workloads eq8x8k,...] [--out DIR]

Per launch (Q and K together, V with the key records, dO with the query records; mxfp8,
nvfp4 whose Q and K launch also writes the score codes, and fp4 whose launches write
decoded bf16 operands, K's and V's also with per-key scales): its bytes are those of every tensor
it reads or writes (each counted once, as a launch that touched each byte once would move
them), its time the CUDA-graphed launch alone (``flamia.bench.timing``'s graph and clock,
median of 3 samples of 200 replays). The copy time is a bf16 ``copy_`` moving as many bytes
(half read, half written), timed the same way;
the ratio is the copy's time over the launch's. The launches' outputs are first checked
against a plain launch of each operand, so the timed path is the one that is right. Writes
results.json, results.md and results.png under --out (default
benchmarks/results/<date>-<gpu>-quantizers).
"""
import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's flamia

from flamia.bench.environment import header, results_dirname  # noqa: E402
from flamia.bench.timing import capture_graph, cuda_clock  # noqa: E402
from flamia.bench.workloads import WORKLOADS, make_case  # noqa: E402
from flamia.kernels import replay  # noqa: E402
from flamia.kernels.configs import ROUTES, tiles_for  # noqa: E402
from flamia.kernels.ops import grad_output_is_codes, inputs_are_codes  # noqa: E402
from flamia.kernels.plan import build_plan  # noqa: E402
from flamia.kernels.quantize import quantize_grad_output, quantize_operand, quantize_pair  # noqa: E402
from flamia.kernels.quantize_fp4 import (quantize_fp4_grad_output, quantize_fp4_operand,  # noqa: E402
                                         quantize_fp4_pair)
from flamia.recipes import RECIPES  # noqa: E402


def touched_bytes(fn) -> int:
    """Bytes of the distinct tensors the launches of fn() take as arguments."""
    with replay.record() as (launches, _):
        fn()
    seen = {}
    for entry in launches:
        if entry is None:
            raise RuntimeError("a launch outside launch.py's keyed path: its arguments are unknown")
        for value in entry[2]:
            if isinstance(value, torch.Tensor):
                seen[value.data_ptr()] = max(seen.get(value.data_ptr(), 0), value.numel() * value.element_size())
    return sum(seen.values())


def timed(fn) -> float:
    """ms per call of fn captured in a CUDA graph (on the caller's side stream)."""
    graph = capture_graph(fn)
    return statistics.median(cuda_clock(graph, 200) for _ in range(3))


def copy_ms(nbytes: int, device) -> float:
    src = torch.randn(nbytes // 4, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    return timed(lambda: dst.copy_(src))


def launches_of(case, recipe: str) -> dict:
    """name -> a function that issues that launch as kernels/ops.py's training call does, after
    checking the Q/K launch once against a plain launch of each operand. The bf16 route on bf16
    inputs has no Q/K launch and no dO^ to write (``ops.inputs_are_codes``, ``ops.grad_output_is_codes``)."""
    i = case.inputs
    rec, route = RECIPES[recipe], ROUTES[recipe]
    own = inputs_are_codes(rec, i.q.dtype)
    d = i.q.shape[-1]
    rotate, block = rec.use_hadamard(d), rec.scale_block
    tiles = tiles_for(d, route)
    plan = build_plan(i.cu_seqlens, i.cu_seqlens, i.q.shape[0], i.k.shape[0], tiles)
    work = plan.work("q_operand")
    if route.all4:
        def pair():
            return quantize_fp4_pair(i.q, i.k, i.cu_seqlens, i.cu_seqlens, rotate, plan.cu_qt, plan.cu_kt, work, work)

        qq, kq = pair()
        for got, x, diagonal in ((qq, i.q, False), (kq, i.k, True)):
            plain = quantize_fp4_operand(x, i.cu_seqlens, rotate, diagonal, plan.cu_qt, work)
            assert torch.equal(got.codes, plain.codes) and torch.equal(got.codes_t, plain.codes_t)
    elif own:
        pair = None
    else:
        def pair():
            return quantize_pair(i.q, i.k, i.cu_seqlens, i.cu_seqlens, block, rotate, plan.cu_qt, plan.cu_kt, work,
                                 work, route.codes, route.scores != route.codes, transposed=not route.rows)

        qq, kq = pair()
        for got, x in ((qq, i.q), (kq, i.k)):
            plain = quantize_operand(x, i.cu_seqlens, block, rotate, not route.rows, plan.cu_qt, work,
                                     fmt=route.codes)
            assert torch.equal(got.exps, plain.exps)
            if got.codes_t is not None:
                assert torch.equal(got.codes_t.view(torch.uint8), plain.codes_t.view(torch.uint8))
    heads, total = i.q.shape[1], i.q.shape[0]
    ro = torch.rand(heads, total, device=i.q.device)
    records = dict(q_exps=None if own else qq.exps,
                   pv=torch.zeros(total, i.k.shape[1], dtype=torch.int32, device=i.q.device),
                   m=torch.zeros(heads, total, device=i.q.device), sigma=rec.sigma)
    grad_out = plan.work("grad_out")
    if route.all4:
        v = lambda: quantize_fp4_operand(i.v, i.cu_seqlens, False, True, plan.cu_kt, work, key_records=True)
        do = lambda: quantize_fp4_grad_output(i.do, i.q, ro, i.cu_seqlens, tiles.bwd_block_m, plan.cu_qt, grad_out,
                                              **records)
    else:
        keys = dict(key_records=True) if own else dict(key_exps=kq.exps)
        v = lambda: quantize_operand(i.v, i.cu_seqlens, block, False, True, plan.cu_kt, work, fmt=route.codes, **keys)
        do = lambda: quantize_grad_output(i.do, i.q, ro, i.cu_seqlens, block, tiles.bwd_block_m, plan.cu_qt, grad_out,
                                          fmt=route.codes, transposed=not route.rows,
                                          own_codes=grad_output_is_codes(rec, i.do), dot_values=route.dot_values,
                                          **records)
    return {name: fn for name, fn in (("q+k", pair), ("v", v), ("do", do)) if fn is not None}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="eq8x8k,skew8k+224x256,logu29-64k,eq4x4k")
    parser.add_argument("--recipes", default="mxfp8,nvfp4,fp4")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    head = header("cuda", sys.argv[1:] if argv is None else argv, {"clock": "CUDA graph, median of 3 x 200"},
                  {name: WORKLOADS[name].lengths for name in args.workloads.split(",")})
    head["command"] = " ".join(["python3 benchmarks/quantizer_bandwidth.py", *(sys.argv[1:] if argv is None else argv)])
    out = Path(args.out or f"benchmarks/results/{results_dirname(head)}-quantizers")
    out.mkdir(parents=True, exist_ok=True)
    torch.cuda.set_stream(torch.cuda.Stream())  # graphs cannot capture the default stream
    rows = []
    for name in args.workloads.split(","):
        case = make_case(WORKLOADS[name], device)
        for recipe in args.recipes.split(","):
            for launch, fn in launches_of(case, recipe).items():
                nbytes = touched_bytes(fn)
                ms, copy = timed(fn), copy_ms(nbytes, device)
                rows.append(dict(workload=name, recipe=recipe, launch=launch, bytes=nbytes, ms=ms, copy_ms=copy,
                                 tb_per_s=nbytes / ms / 1e9, of_copy=copy / ms))
                print(f"{name:16s} {recipe:6s} {launch:4s} {nbytes / 1e6:8.1f} MB {ms:7.4f} ms "
                      f"{nbytes / ms / 1e9:5.2f} TB/s  {copy / ms:5.1%} of copy", flush=True)
    (out / "results.json").write_text(json.dumps(dict(header=head, rows=rows), indent=1))
    lines = [f"# Quantizer launches against the copy bandwidth ({head['device']}, {head['date']})", "",
             "| workload | recipe | launch | MB | ms | TB/s | of copy |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['workload']} | {r['recipe']} | {r['launch']} | {r['bytes'] / 1e6:.1f} | {r['ms']:.4f} | "
              f"{r['tb_per_s']:.2f} | {r['of_copy']:.0%} |" for r in rows]
    (out / "results.md").write_text("\n".join(lines) + "\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(10, 4))
        labels = [f"{r['workload']}\n{r['recipe']} {r['launch']}" for r in rows]
        ax.bar(range(len(rows)), [100 * r["of_copy"] for r in rows])
        ax.axhline(70, color="red", linestyle="--", label="target 70%")
        ax.set_xticks(range(len(rows)), labels, rotation=90, fontsize=6)
        ax.set_ylabel("% of copy bandwidth")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "results.png", dpi=120)
    except ImportError:
        print("matplotlib missing: no results.png")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
