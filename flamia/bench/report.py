"""Reports of a run, written together: results.json, results.md and results.png.

JSON: {"header": {device, versions, date, command, clocks, protocol, not_run}, "records": [...]}, one
record per cell: {"workload", "provider", "recipe", "mode", "ms", "tflops", "spread"} plus
"label" (the column), and where they apply "why" (an n/a cell: ms null), "note" (e.g. why
the call ran eagerly), "emulated" and "peak_gb" (mode "memory": peak GB of one training call).

Markdown: one table per mode, workloads down, providers across; each cell the median time
(fastest measured kernel in bold) and TFLOP/s, or "n/a: why"; the last column is the
speedup of flamia MXFP8 over the fastest peer (the peer's time over flamia's).
"""
import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

TIMED_MODES = ("train", "fwd", "bwd")
TITLES = {
    "train": "Training call (quantization + forward + backward)",
    "fwd": "Forward",
    "bwd": "Backward (forward state saved beforehand)",
    "memory": "Peak memory of one training call",
}
FILES = {"json": "results.json", "markdown": "results.md", "png": "results.png"}


@dataclass
class Record:
    workload: str
    provider: str
    recipe: str
    mode: str
    label: str
    ms: "float | None" = None
    tflops: "float | None" = None
    spread: "float | None" = None
    why: "str | None" = None
    note: "str | None" = None
    emulated: bool = False
    peak_gb: "float | None" = None

    @property
    def key(self) -> tuple[str, str, str, str]:
        return self.workload, self.provider, self.recipe, self.mode

    @property
    def measured(self) -> bool:
        return self.ms is not None or self.peak_gb is not None

    @property
    def is_flamia_mxfp8(self) -> bool:
        return self.provider == "flamia" and self.recipe == "mxfp8"

    def to_json(self) -> dict:
        required = ("workload", "provider", "recipe", "mode", "ms", "tflops", "spread", "label")
        return {k: v for k, v in asdict(self).items() if k in required or (v is not None and v is not False)}

    @classmethod
    def from_json(cls, data: dict) -> "Record":
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


def _escape(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _cell(record: Record, fastest: bool) -> str:
    if not record.measured:
        return f"n/a: {_escape(record.why or 'not measured')}"
    time = f"**{record.ms:.3f} ms**" if fastest else f"{record.ms:.3f} ms"
    rate = f"{record.tflops:.0f}" if record.tflops >= 10 else f"{record.tflops:.2g}"
    return f"{time} <sub>{rate} TF/s</sub>"


def _speedup(row: list[Record]) -> str:
    kernels = [r for r in row if r.measured and not r.emulated]
    ours = [r for r in kernels if r.is_flamia_mxfp8]
    peers = [r.ms for r in kernels if r.provider != "flamia"]
    return f"{min(peers) / ours[0].ms:.2f}x" if ours and peers else "n/a"


def _ordered(values) -> list:
    return list(dict.fromkeys(values))


def _mode_table(records: list[Record], mode: str) -> list[str]:
    rows = [r for r in records if r.mode == mode]
    labels = {}
    for r in rows:  # one column per provider and recipe, titled by its first label
        labels.setdefault((r.provider, r.recipe), r.label)
    columns = list(labels)
    lines = [f"## {TITLES[mode]}", "",
             "| workload | " + " | ".join(labels.values()) + " | flamia MXFP8 speedup |",
             "|---" * (len(columns) + 2) + "|"]
    for workload in _ordered(r.workload for r in rows):
        by_column = {(r.provider, r.recipe): r for r in rows if r.workload == workload}
        row = list(by_column.values())
        best = min((r.ms for r in row if r.measured and not r.emulated), default=None)
        # A column another merged run has but this workload lacks shows as not run.
        cells = [_cell(r, r.measured and not r.emulated and r.ms == best) if r else "not run"
                 for r in (by_column.get(column) for column in columns)]
        lines.append(f"| {workload} | " + " | ".join(cells) + f" | {_speedup(row)} |")
    measured = [r for r in rows if r.measured and r.spread is not None]
    if measured:
        worst = max(measured, key=lambda r: r.spread)
        lines += ["", f"Largest spread (max - min over rounds, / median): {100 * worst.spread:.1f} % "
                      f"({worst.label}, {worst.workload})."]
    lines += [f"- {label}: {note}" for label, note in _ordered((r.label, r.note) for r in rows if r.note)]
    return lines + [""]


def _memory_table(records: list[Record]) -> list[str]:
    rows = [r for r in records if r.mode == "memory"]
    workload = rows[0].workload
    lines = [f"## {TITLES['memory']} ({workload})", "", "| provider | peak GB |", "|---|---|"]
    lines += [f"| {r.label} | {r.peak_gb:.2f} |" if r.measured else f"| {r.label} | n/a: {_escape(r.why or '')} |"
              for r in rows]
    return lines + [""]


def markdown(header: dict, records: list[Record]) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in header["versions"].items())
    lines = ["# flamia bench", "",
             f"- device: {header['device']}", f"- date: {header['date']}",
             f"- command: `{header['command']}`", f"- versions: {versions}"]
    if header.get("clocks"):
        lines.append("- GPU at start: " + ", ".join(f"{k} {v}" for k, v in header["clocks"].items()))
    lines.append(f"- protocol: {header['protocol']}")
    if "elapsed_s" in header:
        lines.append(f"- wall time of the measurements: {header['elapsed_s']} s"
                     + (" (summed over the merged runs)" if header.get("merged_from") else ""))
    for source in header.get("merged_from", []):
        took = f", {source['elapsed_s']} s" if "elapsed_s" in source else ""
        lines.append(f"- merged from: `{source['command']}` ({source['date']}{took})")
    if header.get("not_run"):
        lines.append("- not run in this report (no column below; benchmarks/README.md says how to run them): "
                     + ", ".join(header["not_run"]))
    lines.append("")
    modes = _ordered(r.mode for r in records)
    for mode in (m for m in TIMED_MODES if m in modes):
        lines += _mode_table(records, mode)
    if "memory" in modes:
        lines += _memory_table(records)
    return "\n".join(lines)


def plot(records: list[Record], path: Path) -> None:
    """TFLOP/s per workload and provider, one panel per timed mode (peak GB for memory);
    modes without a measured cell get no panel."""
    panels = [m for m in (*TIMED_MODES, "memory") if any(r.mode == m and r.measured for r in records)]
    # One colour per provider in every panel, so that a bar reads the same across modes.
    palette = matplotlib.colormaps["tab20"]
    colors = {label: palette(i % palette.N) for i, label in enumerate(_ordered(r.label for r in records if r.measured))}
    figure = Figure(figsize=(16, 4 * max(1, len(panels))), layout="constrained")
    FigureCanvasAgg(figure)
    if not panels:
        figure.text(0.5, 0.5, "no measured cells", ha="center")
    for index, mode in enumerate(panels):
        axes = figure.add_subplot(len(panels), 1, index + 1)
        rows = [r for r in records if r.mode == mode]
        workloads = _ordered(r.workload for r in rows)
        labels = _ordered(r.label for r in rows if r.measured)
        width = 0.8 / len(labels)
        for j, label in enumerate(labels):
            xs, ys = zip(*[(workloads.index(r.workload), r.peak_gb if mode == "memory" else r.tflops)
                           for r in rows if r.label == label and r.measured])
            axes.bar([x + (j - (len(labels) - 1) / 2) * width for x in xs], ys, width, label=label,
                     color=colors[label])
        axes.set_xticks(range(len(workloads)), workloads, rotation=20, fontsize=8)
        axes.set_ylabel("peak GB" if mode == "memory" else "TFLOP/s")
        axes.set_title(TITLES[mode])
        axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the bars, never on them
    figure.savefig(path, dpi=110)


def write_report(out_dir: Path, header: dict, records: list[Record]) -> dict[str, Path]:
    """Write the three files under ``out_dir``; returns their paths by kind."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {kind: out_dir / name for kind, name in FILES.items()}
    document = {"header": header, "records": [r.to_json() for r in records]}
    paths["json"].write_text(json.dumps(document, indent=1, allow_nan=False) + "\n")
    paths["markdown"].write_text(markdown(header, records) + "\n")
    plot(records, paths["png"])
    return paths


def load(path: Path) -> tuple[dict, list[Record]]:
    document = json.loads(Path(path).read_text())
    return document["header"], [Record.from_json(r) for r in document["records"]]


def _source(header: dict) -> dict:
    """What a merged report keeps of one run's header."""
    keys = ("command", "date", "device", "elapsed_s")
    return {k: header[k] for k in keys if k in header}


def merge(documents: list[tuple[dict, list[Record]]]) -> tuple[dict, list[Record]]:
    """Several runs (e.g. one per peer bundle) -> one. A measured cell replaces an n/a one;
    between two measured cells the later document wins. The header is the first one's, with
    every document's versions added and each measured run listed under "merged_from" (a
    merged document contributes its own list), with its wall time where recorded; the
    header's wall time is their sum when every run has one."""
    header = json.loads(json.dumps(documents[0][0]))
    header["merged_from"] = [source for h, _ in documents for source in h.get("merged_from") or [_source(h)]]
    header.pop("elapsed_s", None)
    if all("elapsed_s" in source for source in header["merged_from"]):
        header["elapsed_s"] = round(sum(source["elapsed_s"] for source in header["merged_from"]), 1)
    merged: dict[tuple, Record] = {}
    for head, records in documents:
        for name, version in head["versions"].items():
            header["versions"].setdefault(name, version)
        for record in records:
            kept = merged.get(record.key)
            if kept is None or record.measured or not kept.measured:
                merged[record.key] = record
    return header, list(merged.values())
