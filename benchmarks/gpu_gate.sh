#!/usr/bin/env bash
# The GPU gate: everything a change to the kernels must pass on a Hopper machine, with a
# PASS/FAIL summary table at the end (about 9 minutes on an H100 with GATE_TESTS_S=400
# GATE_BUDGET_S=585, benchmarks/README.md; --only splits it over calls).
#
#   benchmarks/gpu_gate.sh [--quick] [--only STEP,...] [--triton BUNDLE]   (from anywhere; runs from the
#                                                                         repository root)
#
# Steps, each under its own timeout and all under one budget (GATE_BUDGET_S, default 540 s:
# a step that the budget no longer fits is not run and counts as failed):
#   gpu-tests      benchmarks/gpu_tests.py tests/ --ignore=tests/test_peer_attention.py (the gpu
#                  tests in GATE_SHARDS concurrent pytest processes, default 6; GATE_TESTS_S,
#                  default 330 s: an H100 needs more, e.g. GATE_TESTS_S=375 GATE_BUDGET_S=585,
#                  about 200 s for the rest)
#   device-tests   benchmarks/gpu_tests.py --marker "not gpu" on the test modules that run on
#                  CUDA when it is present (DEVICE = "cuda" if torch.cuda.is_available() ...):
#                  the CPU suite's kernel tests on the GPU, which -m gpu leaves out
#                  (GATE_DEVICE_TESTS_S, default 240 s; not in --quick)
#   probe          flamia probe --recipe mxfp8           (verdict block-local or exact)
#   probe-exact    flamia probe --recipe mxfp8 --exact   (verdict exact)
#   probe-nvfp4    flamia probe --recipe nvfp4           (verdict block-local or exact)
#   probe-fp4      flamia probe --recipe fp4             (verdict exact)
#   accuracy       flamia accuracy --recipe mxfp8 on 4 x 4096 tokens, 16 heads, d=128, causal
#                  (cos O >= 0.998, cos dQ, dK, dV >= 0.997: tests/test_accuracy.py's bounds)
#   bench-graphed  flamia bench, flamia MXFP8 only, training call, CUDA graphs
#   bench-eager    the same, eager (--no-graphs)
#   sanitize-plain benchmarks/sanitize_case.py alone (compiles what the sanitizers then load)
#   memcheck, racecheck, synccheck, initcheck
#                  compute-sanitizer --tool T on benchmarks/sanitize_case.py: one forward and
#                  backward per kernel family on documents (100, 0, 1, 67, 33), GQA 4/2, d=128
#                  and 64, causal and a window, mxfp8, mxfp8-exact, nvfp4, nvfp4-exact and fp4;
#                  PASS needs 0 errors
# --only STEP,...: run those steps alone (the rest are listed as skipped), e.g. the steps that a
# call cut short, on the same tree as the call that passed the others.
# --quick: the gpu tests of test_kernel_ops.py, test_nonfinite.py and test_gpu_properties.py
# only, one bench workload graphed only, and memcheck only (about 3-4 minutes).
#
# Logs: one per step in $OUT (or benchmarks/results/gate/ when OUT is unset), NN-step.log,
# the bench results in bench-graphed/ and bench-eager/, the table in summary.txt. Exit status
# 0 when every step passed, 1 otherwise (2: bad arguments). flamia is imported from this
# checkout (PYTHONPATH=$PWD, as benchmarks/kernel_check.py and run_h200.sh do); python3 is
# $PYTHON if set; compute-sanitizer is $COMPUTE_SANITIZER, else the one on PATH, else
# /usr/local/cuda/bin/compute-sanitizer. TRITON_PTXAS_PATH and the rest of the environment
# pass through unchanged.
# --triton BUNDLE: run on the Triton that users get instead of the machine's, from a stripped
# wheel tree built by ../shared/wheels/build_triton_bundle.sh (tar.xz): unpacked and put first
# on PYTHONPATH, with the machine's CUDA ptxas (the bundle has none) under both of Triton's
# names for it: Triton 3.9 compiles sm_90 with the tool it calls ptxas-blackwell.
set -uo pipefail

usage() { sed -n '2,48p' "$0" >&2; exit 2; }
quick=0
bundle=
only=
while [[ $# -gt 0 ]]; do
    case "$1" in
        --quick) quick=1 ;;
        --only) [[ $# -ge 2 ]] || usage; only=",$2,"; shift ;;
        --triton) [[ $# -ge 2 ]] || usage; bundle=$(realpath "$2"); shift ;;
        -h|--help) usage ;;
        *) echo "gpu_gate.sh: unknown argument '$1'" >&2; usage ;;
    esac
    shift
done
if [[ -n $bundle ]]; then
    [[ -f $bundle ]] || { echo "gpu_gate.sh: --triton: no such bundle '$bundle'" >&2; exit 2; }
    triton_dir=$(mktemp -d)
    tar xJf "$bundle" -C "$triton_dir" || { echo "gpu_gate.sh: --triton: cannot unpack '$bundle'" >&2; exit 2; }
    export PYTHONPATH="$triton_dir${PYTHONPATH:+:$PYTHONPATH}" TRITON_BACKENDS_IN_TREE=1 \
        TRITON_PTXAS_PATH=${TRITON_PTXAS_PATH:-/usr/local/cuda/bin/ptxas} \
        TRITON_PTXAS_BLACKWELL_PATH=${TRITON_PTXAS_BLACKWELL_PATH:-/usr/local/cuda/bin/ptxas}
fi

cd "$(dirname "$0")/.."
root=$PWD
out=${OUT:-benchmarks/results/gate}
mkdir -p "$out"
out=$(cd "$out" && pwd)
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 GATE_ROOT=$root
PY=${PYTHON:-python3}
budget=${GATE_BUDGET_S:-540}
gate_start=$(date +%s)

sanitizer=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}

# Reads a step's log and prints "PASS|FAIL<TAB>key numbers". Arguments: kind, log, exit status,
# extra (kind-specific: the bench's output folder).
parse() {
    "$PY" - "$@" <<'PYEOF'
import json, os, re, sys

kind, log, rc, extra = sys.argv[1], sys.argv[2], int(sys.argv[3]), (sys.argv[4:] or [""])[0]
text = open(log, errors="replace").read() if os.path.exists(log) else ""
ok, notes = rc == 0, []
if rc in (124, 137):
    notes.append("timed out")
elif rc != 0:
    notes.append(f"exit {rc}")

if kind == "pytest":
    if rc in (124, 137):  # no summed last line: count the results the shards streamed
        sys.path.insert(0, os.path.join(os.environ["GATE_ROOT"], "benchmarks"))
        from gpu_tests import streamed_counts
        counts = streamed_counts(text)
    else:
        counts = {w: int(n) for n, w in re.findall(r"(\d+) (passed|failed|errors?|skipped|xfailed)", text)}
    passed, failed = counts.get("passed", 0), counts.get("failed", 0)
    errors = counts.get("error", 0) + counts.get("errors", 0)
    ok = ok and passed > 0 and failed == 0 and errors == 0
    of = f" of {counts['collected']}" if counts.get("collected") else ""
    notes.insert(0, f"{passed}{of} passed, {failed} failed" + (f", {errors} errors" if errors else "")
                 + (f", {counts['skipped']} skipped" if counts.get("skipped") else ""))
    if rc == 5:
        notes.append("no test collected")
    notes += [f"FAILED {m}" for m in re.findall(r"^(?:\[\d+\] +[\d.]+s )?FAILED (\S+)", text, re.M)[:3]]
elif kind in ("probe", "probe-exact"):
    verdicts = re.findall(r"^verdict: (.*)$", text, re.M)
    verdict = verdicts[0] if verdicts else "no verdict"
    want = ("exact",) if kind == "probe-exact" else ("block-local", "exact")
    ok = ok and bool(verdicts) and verdict.startswith(want)
    notes.insert(0, verdict[:70])
elif kind == "accuracy":
    row = re.search(r"^mxfp8\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", text, re.M)
    if row:
        cos = dict(zip(("O", "dQ", "dK", "dV"), map(float, row.groups())))
        ok = ok and cos["O"] >= 0.998 and min(cos["dQ"], cos["dK"], cos["dV"]) >= 0.997
        notes.insert(0, "cos " + " ".join(f"{k} {v:.5f}" for k, v in cos.items()))
    else:
        ok = False
        notes.insert(0, "no mxfp8 row")
elif kind == "bench":
    path = os.path.join(extra, "results.json")
    try:
        records = [r for r in json.load(open(path))["records"] if r.get("mode") == "train"]
    except (OSError, ValueError, KeyError):
        records = []
    timed = [r for r in records if r.get("ms") is not None]
    ok = ok and bool(records) and len(timed) == len(records)
    notes.insert(0, ", ".join(f"{r['workload']} {r['ms']:.3f} ms" for r in timed) or "no timing")
    notes += [f"{r['workload']}: {r.get('why')}" for r in records if r.get("ms") is None][:2]
elif kind == "sanitize-plain":
    done = re.search(r"^sanitize_case: (\d+) of (\d+) cases ok", text, re.M)
    ok = ok and bool(done) and done.group(1) == done.group(2)
    notes.insert(0, done.group(0).removeprefix("sanitize_case: ") if done else "driver did not finish")
elif kind == "sanitizer":
    summary = re.findall(r"(?:ERROR|RACECHECK) SUMMARY: .*", text)
    done = re.search(r"^sanitize_case: (\d+) of (\d+) cases ok", text, re.M)
    errors = [int(n) for line in summary for n in re.findall(r"(\d+) errors?", line)]
    ok = ok and bool(summary) and bool(done) and done.group(1) == done.group(2) and sum(errors) == 0
    notes.insert(0, summary[-1].strip() if summary else "no sanitizer summary")
    if not done:
        notes.append("driver did not finish")
    notes += sorted(set(re.findall(r"^========= (Invalid \w+.*? of size \d+|\w+ hazard detected.*?|"
                                   r"Uninitialized __global__ memory read.*?)(?: at|$)", text, re.M)))[:2]
else:
    ok, notes = False, [f"unknown kind {kind}"]
print(("PASS" if ok else "FAIL") + "\t" + "; ".join(notes))
PYEOF
}

names=() results=() seconds=() notes=()
failed=0

# left_out NAME: --only names other steps than NAME.
left_out() { [[ -n $only && $only != *",$1,"* ]]; }

# step NAME KIND TIMEOUT_S COMMAND... : runs COMMAND under min(TIMEOUT_S, what is left of
# the budget), its output in $out/NN-NAME.log, and records the parsed result.
step() {
    local name="$1" kind="$2" limit="$3"
    shift 3
    local n=$(( ${#names[@]} + 1 ))
    if left_out "$name"; then
        names+=("$name") results+=(SKIP) seconds+=(0) notes+=("not in --only")
        return
    fi
    local log
    log=$(printf '%s/%02d-%s.log' "$out" "$n" "$name")
    local left=$(( budget - ($(date +%s) - gate_start) - 5 ))
    (( limit > left )) && limit=$left
    names+=("$name")
    if (( limit < 10 )); then
        results+=(FAIL) seconds+=(0) notes+=("not run: the gate's ${budget} s budget is spent")
        failed=1
        echo "[gate] $name: not run (budget spent)" >&2
        return
    fi
    echo "[gate] $name (timeout ${limit} s): $*" >&2
    local t0 rc
    t0=$(date +%s)
    { echo "# $*"; echo "# timeout ${limit} s, $(date -u '+%Y-%m-%d %H:%M:%S UTC')"; } > "$log"
    timeout --kill-after=10 "$limit" "$@" >> "$log" 2>&1
    rc=$?
    local took=$(( $(date +%s) - t0 ))
    echo "# exit status $rc after ${took} s" >> "$log"
    local parsed
    parsed=$(parse "$kind" "$log" "$rc" "${STEP_EXTRA:-}") || parsed=$'FAIL\tcould not parse the log'
    results+=("${parsed%%$'\t'*}") seconds+=("$took") notes+=("${parsed#*$'\t'}")
    [[ "${parsed%%$'\t'*}" == PASS ]] || failed=1
    echo "[gate] $name: ${parsed%%$'\t'*} (${took} s) ${parsed#*$'\t'}" >&2
}

{
    echo "gpu gate$([[ $quick == 1 ]] && echo ' (quick)'), $(date -u '+%Y-%m-%d %H:%M UTC'), logs in $out"
    nvidia-smi -L 2>/dev/null || echo "nvidia-smi: not available"
    "$PY" -c 'import torch, triton, numpy, sys
print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__, "numpy", numpy.__version__,
      "cuda", torch.version.cuda, "device", torch.cuda.get_device_name() if torch.cuda.is_available() else "none")' 2>&1
    echo "checkout $(git -C "$root" log --oneline -1 2>/dev/null || echo '(no git metadata)'); TRITON_PTXAS_PATH=${TRITON_PTXAS_PATH:-unset}; TRITON_PTXAS_BLACKWELL_PATH=${TRITON_PTXAS_BLACKWELL_PATH:-unset}"
    echo "compute-sanitizer: $sanitizer"
} | tee "$out/header.txt"

if [[ $quick == 1 ]]; then
    step gpu-tests pytest 200 "$PY" benchmarks/gpu_tests.py tests/test_kernel_ops.py tests/test_nonfinite.py \
        tests/test_gpu_properties.py
else
    step gpu-tests pytest "${GATE_TESTS_S:-330}" "$PY" benchmarks/gpu_tests.py tests/ --ignore=tests/test_peer_attention.py
    mapfile -t device_modules < <(grep -l '^DEVICE = "cuda" if torch.cuda.is_available()' tests/test_*.py)
    step device-tests pytest "${GATE_DEVICE_TESTS_S:-240}" "$PY" benchmarks/gpu_tests.py --marker "not gpu" \
        "${device_modules[@]}"
fi
step probe probe 60 "$PY" -m flamia probe --recipe mxfp8
step probe-exact probe-exact 60 "$PY" -m flamia probe --recipe mxfp8 --exact
step probe-nvfp4 probe 60 "$PY" -m flamia probe --recipe nvfp4
step probe-fp4 probe-exact 60 "$PY" -m flamia probe --recipe fp4
step accuracy accuracy 60 "$PY" -m flamia accuracy --recipe mxfp8 --lengths 4096,4096,4096,4096 --heads 16 \
    --head-dim 128
workloads=eq4x4k,logu11-16k
[[ $quick == 1 ]] && workloads=eq4x4k
rm -rf "$out/bench-graphed" "$out/bench-eager"
STEP_EXTRA="$out/bench-graphed" step bench-graphed bench 60 "$PY" -m flamia bench --workloads "$workloads" \
    --providers flamia:mxfp8 --modes train --alone --peek --out "$out/bench-graphed"
if [[ $quick == 0 ]]; then
    STEP_EXTRA="$out/bench-eager" step bench-eager bench 45 "$PY" -m flamia bench --workloads "$workloads" \
        --providers flamia:mxfp8 --modes train --alone --no-graphs --peek --out "$out/bench-eager"
fi
step sanitize-plain sanitize-plain 75 "$PY" benchmarks/sanitize_case.py
tools=(memcheck racecheck synccheck initcheck)
[[ $quick == 1 ]] && tools=(memcheck)
for tool in "${tools[@]}"; do
    limit=45
    [[ $tool == racecheck ]] && limit=75
    if [[ -x "$sanitizer" ]] || left_out "$tool"; then  # step() lists what --only leaves out
        # Without the caching allocator every tensor is its own allocation, so memcheck sees an
        # access past a tensor's end and initcheck a read of memory nothing wrote.
        step "$tool" sanitizer "$limit" env PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$sanitizer" --tool "$tool" \
            --error-exitcode 86 --print-limit 20 "$PY" benchmarks/sanitize_case.py
    else
        names+=("$tool") results+=(FAIL) seconds+=(0) notes+=("compute-sanitizer not found at $sanitizer")
        failed=1
    fi
done

{
    echo
    printf '%-15s %-6s %6s  %s\n' step result time "key numbers"
    printf '%-15s %-6s %6s  %s\n' --------------- ------ ------ -----------
    for i in "${!names[@]}"; do
        printf '%-15s %-6s %5ss  %s\n' "${names[$i]}" "${results[$i]}" "${seconds[$i]}" "${notes[$i]}"
    done
    echo "gate${only:+ (--only ${only:1:-1})}: $([[ $failed == 0 ]] && echo PASS || echo FAIL) in $(( $(date +%s) - gate_start )) s; logs in $out"
} | tee "$out/summary.txt"
exit "$failed"
