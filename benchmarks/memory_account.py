"""Which tensors make the peak memory of one training call, counted on the CPU.

    PYTHONPATH=. python3 benchmarks/memory_account.py [--workload logu29-64k] [--recipes mxfp8,bf16,...]
                                                      [--out DIR]

``flamia bench --modes memory`` measures a provider's peak on the GPU (issue 21's target: at
most FA4's on logu29-64k). This script says where flamia's comes from, without a GPU: it runs
the bench's memory job (q, k, v cloned with requires_grad, two calls of forward and
torch.autograd.grad against dO) on CPU tensors of the workload's shapes, with every kernel
launch skipped and the launchers taking their GPU branches, so the host code allocates what
it allocates on the GPU. A TorchDispatchMode counts each storage from the op that creates it
until it is freed; at the highest count it lists the live storages, each with the flamia line
that allocated it. What it does not see: the replay programs (``kernels/replay.py``) that
later GPU calls run put the same residuals in one workspace and the rest in one scratch
buffer, which moves bytes between entries, not the peak; and the caching allocator's
rounding, 2 MB at most per block. Writes results.json, results.md and results.png under --out
(default benchmarks/results/<date>-cpu-memory).
"""
import argparse
import datetime
import json
import os
import sys
import traceback
import weakref
from pathlib import Path

if __name__ == "__main__":
    # Kernels decorated from here on take CPU tensors (never run: gpu_launch_path). An importer
    # sets it itself (tests/conftest.py does without CUDA): set at import, it would make every
    # kernel that the importing process decorates later an interpreted one.
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's flamia

from flamia.bench.environment import versions  # noqa: E402
from sass_offline import gpu_launch_path  # noqa: E402
from flamia.bench.workloads import WORKLOADS, make_case  # noqa: E402

_LISTED = 1 << 20  # storages below 1 MiB are summed as "smaller"
_ROOT = str(Path(__file__).resolve().parents[1] / "flamia")


def _origin() -> str:
    """The innermost flamia line on the stack, outside this script: where a storage was made."""
    for frame in reversed(traceback.extract_stack()):
        if frame.filename.startswith(_ROOT):
            return f"{Path(frame.filename).relative_to(Path(_ROOT).parent)}:{frame.lineno} ({frame.name})"
    return "benchmarks/memory_account.py (the job)"


class LiveStorages(TorchDispatchMode):
    """Counts the bytes of live storages created under it and keeps the list at the peak."""

    def __init__(self):
        super().__init__()
        self.live, self.peak, self.at_peak, self.entries = 0, 0, [], {}

    def _free(self, key: int, nbytes: int) -> None:
        self.live -= nbytes
        self.entries.pop(key, None)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        # views and in-place results share an argument's storage, which may predate the count
        given = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key, nbytes = storage.data_ptr(), storage.nbytes()
            if nbytes == 0 or key in self.entries or key in given:
                continue
            where = _origin() if nbytes >= _LISTED else "smaller"
            self.entries[key] = (nbytes, str(t.dtype).removeprefix("torch."), list(t.shape), where)
            self.live += nbytes
            weakref.finalize(storage, self._free, key, nbytes)
            if self.live > self.peak:
                self.peak, self.at_peak = self.live, list(self.entries.values())
        return out


def account(workload: str, recipe: str) -> dict:
    """The peak bytes of the bench's memory job for flamia with ``recipe`` on ``workload``,
    and the storages live at that peak, grouped by the line that made them and their dtype."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("memory_account.account needs TRITON_INTERPRET=1 set before flamia's kernels are "
                           "imported (its launches take CPU tensors)")
    from flamia import ops
    from flamia.recipes import resolve_recipe
    from flamia.spec import AttnSpec

    i = make_case(WORKLOADS[workload], "cpu").inputs
    spec = AttnSpec(i.cu_seqlens, i.cu_seqlens, i.max_seqlen, i.max_seqlen, True, i.q.shape[-1] ** -0.5, (-1, -1),
                    resolve_recipe(recipe))
    with gpu_launch_path(lambda kernel, *args, **kwargs: None), LiveStorages() as mode:
        q, k, v = (x.detach().clone().requires_grad_() for x in (i.q, i.k, i.v))  # as bench.jobs.autograd_job
        for _ in range(2):
            out, _ = ops.attention(q, k, v, spec, "triton")
            torch.autograd.grad(out, (q, k, v), i.do)
            del out
    groups: dict[tuple, list] = {}
    for nbytes, dtype, shape, where in mode.at_peak:
        entry = groups.setdefault((where, dtype), [0, 0, shape])
        entry[0] += nbytes
        entry[1] += 1
    rows = sorted(({"where": w, "dtype": d, "count": n, "shape": s, "gb": b / 1e9}
                   for (w, d), (b, n, s) in groups.items()), key=lambda r: -r["gb"])
    return {"recipe": recipe, "workload": workload, "peak_gb": mode.peak / 1e9, "at_peak": rows}


def markdown(head: dict, results: list[dict]) -> str:
    lines = [f"# Peak memory of one training call, counted on the CPU ({head['workload']})", "",
             f"{head['date']}, {head['command']}; launches skipped, allocations as on the GPU path.", "",
             "| recipe | peak GB |", "|---|---|"]
    lines += [f"| {r['recipe']} | {r['peak_gb']:.3f} |" for r in results]
    for r in results:
        lines += ["", f"## {r['recipe']}: live at the peak", "", "| GB | storages | dtype | shape | made at |",
                  "|---|---|---|---|---|"]
        lines += [f"| {row['gb']:.3f} | {row['count']} | {row['dtype']} | {row['shape']} | {row['where']} |"
                  for row in r["at_peak"]]
    return "\n".join(lines)


def plot(results: list[dict], path: Path) -> None:
    """A stacked bar per recipe: the storages live at its peak, by the line that made them."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    def label(row: dict) -> str:
        return f"{row['where']} {row['dtype']}"

    figure = Figure(figsize=(11, 5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    palette = matplotlib.colormaps["tab20"]
    colors = {name: palette(j % palette.N)
              for j, name in enumerate(dict.fromkeys(label(row) for r in results for row in r["at_peak"]))}
    for x, r in enumerate(results):
        bottom = 0.0
        for row in r["at_peak"]:
            axes.bar(x, row["gb"], bottom=bottom, color=colors[label(row)], edgecolor="white")
            bottom += row["gb"]
    axes.set_xticks(range(len(results)), [r["recipe"] for r in results])
    axes.set_ylabel("GB live at the peak")
    axes.set_title(f"flamia training call, {results[0]['workload']}, counted on the CPU")
    axes.legend(handles=[Patch(color=color, label=name) for name, color in colors.items()], fontsize=6,
                loc="upper left", bbox_to_anchor=(1.0, 1.0))
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", default="logu29-64k", choices=sorted(WORKLOADS))
    parser.add_argument("--recipes", default="mxfp8,bf16,nvfp4,fp4")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results = [account(args.workload, recipe) for recipe in args.recipes.split(",")]
    head = {"device": "cpu (launches skipped)", "versions": versions(), "workload": args.workload,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": "python3 benchmarks/memory_account.py " + " ".join(sys.argv[1:])}
    out = args.out or Path(__file__).parent / "results" / f"{head['date'][:10]}-cpu-memory"
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"header": head, "results": results}, indent=1) + "\n")
    (out / "results.md").write_text(markdown(head, results) + "\n")
    plot(results, out / "results.png")
    for r in results:
        print(f"{r['recipe']:>6}: peak {r['peak_gb']:.3f} GB")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
