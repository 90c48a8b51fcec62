#!/usr/bin/env bash
# Time flamia at each level of a stack of patches, in one call on the GPU machine: level 0 is
# this checkout, level i has patches 1..i applied on top (patch -p1, no fuzz), each level in
# its own copy and process. Every level first runs each cell once, all levels at once, so
# their kernels compile side by side before any timing. What one gate run over the whole
# stack cannot tell: which patch moved the time.
#
#   benchmarks/stack_bench.sh PATCH... -- FLAMIA_BENCH_ARGS...
#   e.g. benchmarks/stack_bench.sh pending/000[3-7]-*.patch -- --providers flamia:mxfp8,flamia:bf16 \
#            --modes train --alone --workloads eq4x4k,logu11-16k
#
# Output in $OUT (default benchmarks/results/stack): stack.json ({"levels": [patch names],
# "records": flamia bench's records, each with its "level"}) and stack.md (ms per workload,
# provider and mode, a column per level, and each level's change against the one before).
# A level whose patch does not apply, or whose bench fails, ends the stack there (its log is
# printed). Levels run one after another, never beside each other: they time the same GPU.
# The table is rewritten after every level, so a call that runs out of time keeps what it timed.
set -euo pipefail

patches=()
while [[ $# -gt 0 && $1 != -- ]]; do patches+=("$(realpath "$1")"); shift; done
[[ $# -gt 0 ]] && shift  # the --
[[ ${#patches[@]} -gt 0 ]] || { sed -n '2,17p' "$0" >&2; exit 2; }

cd "$(dirname "$0")/.."
root=$PWD
out=${OUT:-benchmarks/results/stack}
mkdir -p "$out"
out=$(cd "$out" && pwd)
PY=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

summarize() {  # stack.json and stack.md from the levels timed so far (timed)
"$PY" - "$work" "$out" "${timed[@]}" <<'PYEOF'
import json, sys
from pathlib import Path

work, out, levels = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
records = []
for i in range(len(levels)):
    for r in json.loads((work / f"bench-{i}" / "results.json").read_text())["records"]:
        records.append({**r, "level": i})
(out / "stack.json").write_text(json.dumps({"levels": levels, "records": records}, indent=1))
cells = {}
for r in records:
    cells.setdefault((r["workload"], r["label"], r["mode"]), {})[r["level"]] = r["ms"]
head = "| workload | provider | mode | " + " | ".join(f"level {i}" for i in range(len(levels))) + " |"
lines = [head, "|" + "---|" * (3 + len(levels))]
for (workload, label, mode), ms in sorted(cells.items()):
    row = []
    for i in range(len(levels)):
        now, before = ms.get(i), ms.get(i - 1)
        text = "n/a" if now is None else f"{now:.3f}"
        if now is not None and before:
            text += f" ({100 * (now / before - 1):+.1f}%)"
        row.append(text)
    lines.append(f"| {workload} | {label} | {mode} | " + " | ".join(row) + " |")
names = "\n".join(f"- level {i}: {name}" for i, name in enumerate(levels))
(out / "stack.md").write_text("ms per call (median); in brackets, the change against the level before.\n\n"
                              + "\n".join(lines) + "\n\n" + names + "\n")
PYEOF
}

warm() {  # one call of every cell on level $1's tree: its kernels compile before any timing
    (cd "$1" && PYTHONPATH="$1" "$PY" - "${@:2}" <<'PYEOF'
import sys

import torch

from flamia.bench.run import parse_args
from flamia.bench.workloads import make_case, shrink

args = parse_args(sys.argv[1:])
device = "cpu" if args.dry_run else "cuda"
for workload in args.workloads:
    case = make_case(shrink(workload) if args.dry_run else workload, device)
    for provider in args.providers:
        for mode in args.modes:
            if mode != "memory" and provider.unsupported(workload, mode) is None:
                provider.build(case, mode)()
if device == "cuda":
    torch.cuda.synchronize()
PYEOF
    )
}

# Every level's tree first, then every level's kernels compiled at once (the compiles share
# Triton's cache and the machine's cores; each level alone would spend minutes on them),
# then the timing, one level after another.
tree="$work/level-0"
mkdir "$tree"
tar -C "$root" --exclude=./.git --exclude=./benchmarks/results -cf - . | tar -C "$tree" -xf -
levels=("base")
trees=("$tree")
timed=()
for ((i = 1; i <= ${#patches[@]}; i++)); do
    next="$work/level-$i"
    cp -a "$tree" "$next"
    if ! (cd "$next" && patch -p1 -s -F0 --no-backup-if-mismatch < "${patches[i - 1]}"); then
        echo "stack_bench.sh: ${patches[i - 1]} does not apply on level $((i - 1)); the stack ends there" >&2
        break
    fi
    tree=$next
    trees+=("$tree")
    levels+=("$(basename "${patches[i - 1]}")")
done
for ((i = 0; i < ${#trees[@]}; i++)); do warm "${trees[i]}" "$@" > "$work/warm-$i.log" 2>&1 & done
wait || true  # a level that fails to warm fails its bench below, which says why
for ((i = 0; i < ${#trees[@]}; i++)); do
    tree=${trees[i]}
    echo "== level $i: ${levels[i]}" >&2
    if ! (cd "$tree" && PYTHONPATH="$tree" "$PY" -m flamia bench --out "$work/bench-$i" "$@" > "$work/bench-$i.log" 2>&1); then
        cat "$work/bench-$i.log" >&2
        echo "stack_bench.sh: level $i's bench failed; the stack ends there" >&2
        break
    fi
    timed+=("${levels[i]}")
    summarize  # after every level: a call that runs out of time keeps the levels it timed
done
if [[ -f $out/stack.md ]]; then cat "$out/stack.md"; fi

