"""Results of the training experiment: a markdown table and curves from <run>.json files.

    flamia train --report [--results-dir experiments/results] [--baseline DIR:RUN,RUN]

``--baseline`` adds runs of another results folder to the table and curves, named
"run (its profile)", so that a profile that changes some runs is read against the unchanged
ones (e.g. small-sumq against small's bf16). Writes, next to the JSON files: results.md (one
row per run, its last evaluation, then the paper's two claims checked on these runs),
loss_curves.png (validation loss through the run's own attention, solid, and through exact
attention, dashed), grad_norm.png and single_step_cos.png (against the training step).
"""
import json
from dataclasses import asdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

from flamia.recipes import Recipe  # noqa: E402

from .config import MISMATCH_BASELINES, SettingError  # noqa: E402

# A run is unstable once an evaluation's mean pre-clipping gradient norm passes this (the
# norm is clipped at 1.0; bf16's largest mean is 1.8-3.0 in the small and paper profiles).
UNSTABLE_GRAD_NORM = 10.0

COLUMNS = ("run", "attention", "steps", "val loss own", "val loss exact", "exact - own",
           "grad norm (last / max)", "single-step cos", "tokens/s", "status")


def load_results(results_dir: Path) -> list[dict]:
    """Every <run>.json under ``results_dir`` with at least one record, sorted by run name."""
    docs = [json.loads(p.read_text()) for p in sorted(results_dir.glob("*.json"))]
    return [d for d in docs if d.get("records")]


def load_baseline(spec: str) -> list[dict]:
    """"DIR:RUN,RUN" -> those runs' documents, each renamed "run (profile)"."""
    folder, _, names = spec.rpartition(":")
    if not folder or not names:
        raise SettingError(f"--baseline: expected DIR:RUN[,RUN...], got {spec!r}")
    docs = []
    for name in names.split(","):
        path = Path(folder) / f"{name}.json"
        if not path.exists():
            raise SettingError(f"--baseline: no {path}; give DIR:RUN,RUN with a DIR/RUN.json for each RUN")
        doc = json.loads(path.read_text())
        docs.append({**doc, "run": f"{doc['run']} ({doc['config']['profile']})"})
    return docs


def _attention_label(doc: dict) -> str:
    att = doc["attention"]
    if att["attn"] == "sdpa":
        return "SDPA bf16"
    recipe = att["recipe"]
    preset = asdict(Recipe(recipe["name"]))
    switches = [f"{k}={v}" for k, v in recipe.items() if preset.get(k) != v]
    return f"{recipe['name']} ({att['backend']}{', ' + ', '.join(switches) if switches else ''})"


def _status(doc: dict) -> str:
    if doc["diverged_step"] is not None:
        return f"diverged at step {doc['diverged_step']}"
    return "done" if doc["done"] else f"partial ({doc['steps_done']}/{doc['config']['steps']})"


def table_row(doc: dict) -> list[str]:
    last = doc["records"][-1]
    norms = [r["grad_norm"] for r in doc["records"]]
    tps = doc.get("tokens_per_s")
    return [doc["run"], _attention_label(doc), str(last["step"]), f"{last['val_loss_own']:.4f}",
            f"{last['val_loss_exact']:.4f}", f"{last['val_loss_exact'] - last['val_loss_own']:+.4f}",
            f"{norms[-1]:.3f} / {max(norms):.3f}", f"{last['single_step_cos']:.5f}",
            f"{tps / 1e3:.1f}k" if tps else "-", _status(doc)]


def markdown_table(docs: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(table_row(d)) + " |" for d in docs]
    profiles = sorted({f"{d['config']['profile']} ({d['config']['n_layer']} layers, width "
                       f"{d['config']['d_model']}, {d['config']['steps']} steps)" for d in docs})
    note = ("Validation loss in nats per byte at the last evaluation; exact = the same weights "
            "evaluated with SDPA in fp32 and the same document mask. Grad norm: mean pre-clipping "
            "norm over the steps before each evaluation. single-step cos: attention gradients "
            "(dQ, dK, dV) of layer 1 against exact attention on a fixed validation batch.")
    return f"# Training experiment\n\nProfile: {', '.join(profiles)}.\n\n{note}\n\n" + "\n".join(lines) + "\n"


def _by_name(docs: list[dict]) -> dict[str, dict]:
    """Documents by run name, a baseline's "run (profile)" under its run's name too."""
    return {name: d for d in docs for name in {d["run"], d["run"].split(" (")[0]}}


def _unstable_at(doc: dict) -> "int | None":
    """The first evaluation's step whose mean gradient norm passes UNSTABLE_GRAD_NORM."""
    return next((r["step"] for r in doc["records"] if r["grad_norm"] > UNSTABLE_GRAD_NORM), None)


def _leak_claim(runs: dict[str, dict]) -> str:
    """Claim 1: the leak scores below bf16 through its own attention, above it through exact."""
    if "leak" not in runs or "bf16" not in runs:
        return "not tested (needs the leak and bf16 runs)"
    leak, bf16 = runs["leak"]["records"][-1], runs["bf16"]["records"][-1]
    if leak["step"] != bf16["step"]:
        return f"not tested (leak's last evaluation is at step {leak['step']}, bf16's at {bf16['step']})"
    own, exact, base = leak["val_loss_own"], leak["val_loss_exact"], bf16["val_loss_own"]
    verdict = "reproduced" if own < base < exact else "not reproduced"
    return f"{verdict}: leak {own:.4f} own, {exact:.4f} exact; bf16 {base:.4f} (step {leak['step']})"


def _mismatch_claim(runs: dict[str, dict]) -> str:
    """Claim 2: at least two mismatches destabilise training whose consistent run is stable."""
    parts, tested, destabilised = [], 0, 0
    for mm, base in MISMATCH_BASELINES.items():
        if mm not in runs or base not in runs:
            continue
        at, base_at = _unstable_at(runs[mm]), _unstable_at(runs[base])
        if base_at is not None:
            parts.append(f"{mm} untested ({base} unstable from step {base_at})")
            continue
        tested += 1
        destabilised += at is not None
        parts.append(f"{mm} " + (f"unstable from step {at}" if at is not None else "stable") + f", {base} stable")
    if not parts:
        return "not tested (needs a mismatch run and its consistent run)"
    verdict = "reproduced" if destabilised >= 2 else "not reproduced" if tested else "not tested"
    return f"{verdict}: " + "; ".join(parts)


def claims_section(docs: list[dict]) -> str:
    """The paper's two claims (experiments/README.md), judged on the runs in ``docs``."""
    runs = _by_name(docs)
    return ("\n## Claims\n\nUnstable: an evaluation's mean gradient norm above "
            f"{UNSTABLE_GRAD_NORM:g}.\n\n"
            f"1. A leaking 4-bit configuration scores below bf16 through its own attention and above "
            f"it through exact attention: {_leak_claim(runs)}.\n"
            f"2. Forward/backward mismatches destabilise training (at least two): {_mismatch_claim(runs)}.\n")


def plot_metric(docs: list[dict], keys: tuple[str, ...], ylabel: str, path: Path, log: bool = False) -> Path:
    """One line per run and key (the first key solid, the others dashed), against the step."""
    fig, ax = plt.subplots(figsize=(8, 5))
    # tab10's colours repeat from the 11th run on: tab20 then keeps every run its own
    colors = plt.get_cmap("tab10" if len(docs) <= 10 else "tab20")
    for i, doc in enumerate(docs):
        steps = [r["step"] for r in doc["records"]]
        for key, style in zip(keys, ("-", "--")):
            label = doc["run"] if key == keys[0] else None
            values = [r[key] for r in doc["records"]]
            ax.plot(steps, values, style, color=colors(i % colors.N), marker=".", label=label)
    if len(keys) > 1:
        ax.plot([], [], "k-", label=keys[0])
        ax.plot([], [], "k--", label=keys[1])
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_report(results_dir: Path, baseline: "list[dict] | None" = None) -> list[Path]:
    """Table and curves of every run under ``results_dir`` (after the ``baseline`` runs of
    ``load_baseline``); returns the files written."""
    docs = (baseline or []) + load_results(results_dir)
    if not docs:
        raise SettingError(f"--results-dir: no <run>.json with records under {results_dir}")
    table = results_dir / "results.md"
    table.write_text(markdown_table(docs) + claims_section(docs))
    return [table,
            plot_metric(docs, ("val_loss_own", "val_loss_exact"), "validation loss (nats/byte)",
                        results_dir / "loss_curves.png"),
            plot_metric(docs, ("grad_norm",), "gradient norm (pre-clipping)",
                        results_dir / "grad_norm.png", log=True),
            plot_metric(docs, ("single_step_cos",), "single-step attention gradient cosine",
                        results_dir / "single_step_cos.png")]
