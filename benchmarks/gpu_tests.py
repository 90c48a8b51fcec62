"""Run the gpu-marked tests (or those of another marker) in parallel pytest processes on one GPU,
for the GPU gate.

    python3 benchmarks/gpu_tests.py [--shards N] [--marker EXPR] [PYTEST_ARGS...]
        (default: tests/, $GATE_SHARDS or 6 shards, -m gpu; the gate's device-tests step passes
        --marker "not gpu" for the tests that run on CUDA when it is present)

The ~180 gpu tests spend most of their time in Python (the emulator they compare against,
compiles, checks), not on the GPU, so one process leaves the GPU idle and the gate's budget
short. The collected test ids are dealt round-robin into N shards that run concurrently:
the slow tests sit together in a few files (compiles, property draws, the bench), so whole
files or contiguous runs leave one shard with most of the time. Compiled kernels are shared
through Triton's on-disk cache. Each shard's output (pytest -v) goes to stdout line by line
as it comes, prefixed with its number and its elapsed seconds, so a run that a timeout stops
shows where each shard was (``timeout`` stops the shards with it: they share its process
group). The first line says how many tests were collected; the last sums the counts in
pytest's words ("N passed, M failed ...") for gpu_gate.sh to read, which counts the streamed
result lines instead (``streamed_counts``) when a timeout leaves no last line. Exit status 0
when every shard passed.
"""
import argparse
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

PYTEST = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]
COUNTED = ("passed", "failed", "errors", "error", "skipped", "xfailed")
FINAL_LINE = re.compile(r"\d+ (passed|failed|errors?|skipped|xfailed)\b.* in [\d.]+s")  # pytest's last line
# one test's result as a shard streams it: "[shard] seconds path::test[id] PASSED [ 12%]"
RESULT_LINE = re.compile(r"^\[\d+\] +[\d.]+s \S+::\S+ (PASSED|FAILED|ERROR|SKIPPED|XFAIL)\b", re.M)
COLLECTED_LINE = re.compile(r"^collected (\d+) tests", re.M)


def streamed_counts(text: str) -> dict[str, int]:
    """Counts of the per-test results in this script's output ({"passed": n, ...}, pytest's
    words) and, under "collected", the number of tests it collected: what a run stopped by a
    timeout got through, where no last line sums it."""
    words = {"PASSED": "passed", "FAILED": "failed", "ERROR": "errors", "SKIPPED": "skipped", "XFAIL": "xfailed"}
    counts: dict[str, int] = {}
    for result in RESULT_LINE.findall(text):
        counts[words[result]] = counts.get(words[result], 0) + 1
    collected = COLLECTED_LINE.search(text)
    if collected:
        counts["collected"] = int(collected.group(1))
    return counts


def collect(marker: str, args: list[str]) -> list[str]:
    out = subprocess.run(PYTEST + ["-q", "--collect-only", "-m", marker, *args], capture_output=True, text=True)
    ids = [line for line in out.stdout.splitlines() if "::" in line]
    if out.returncode not in (0, 5):
        sys.exit(f"gpu_tests: collection failed (exit {out.returncode}):\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
    return ids


def run_shard(index: int, marker: str, ids: list[str]) -> tuple[int, str]:
    """One shard's pytest, each line of its output printed as it comes, prefixed with the
    shard's number and the seconds since the shard started, so a run stopped by a timeout
    still shows how far each shard got and which tests took the time."""
    start = time.perf_counter()
    proc = subprocess.Popen(PYTEST + ["-v", "-m", marker, "--durations=5", *ids], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        print(f"[{index}] {time.perf_counter() - start:6.1f}s {line}", end="", flush=True)
    return proc.wait(), "".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    # a string default goes through type=int, so a bad $GATE_SHARDS is named as --shards' value
    parser.add_argument("--shards", type=int, default=os.environ.get("GATE_SHARDS", "6"),
                        help="concurrent pytest processes (default: $GATE_SHARDS, else 6)")
    parser.add_argument("--marker", default="gpu", help="the tests' marker expression, pytest's -m (default: gpu)")
    known, rest = parser.parse_known_args()
    if known.shards < 1:
        parser.error(f"--shards must be >= 1, got {known.shards}")
    ids = collect(known.marker, rest or ["tests/"])
    if not ids:
        print(f"no tests ran: 0 tests collected (-m {known.marker})")
        return 5
    n = min(known.shards, len(ids))
    print(f"collected {len(ids)} tests (-m {known.marker}), {n} shards", flush=True)
    start = time.perf_counter()
    with ThreadPoolExecutor(n) as pool:
        results = list(pool.map(run_shard, range(n), [known.marker] * n, [ids[i::n] for i in range(n)]))
    totals: dict[str, int] = {}
    for _, text in results:
        summary = [line for line in text.splitlines() if FINAL_LINE.search(line)]
        for count, word in re.findall(r"(\d+) (\w+)", summary[-1] if summary else ""):
            if word in COUNTED:
                totals[word] = totals.get(word, 0) + int(count)
    words = ", ".join(f"{totals[w]} {w}" for w in COUNTED if totals.get(w)) or "no summary"
    print(f"{words} in {time.perf_counter() - start:.1f}s ({len(ids)} tests, {n} shards)")
    return 0 if all(rc == 0 for rc, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
