"""benchmarks/stack_bench.sh on the CPU (flamia bench --dry-run): a level per patch of a stack,
one JSON and one markdown table in $OUT, and a patch that does not apply ends the stack there."""
import json
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "stack_bench.sh"
BENCH = ["--dry-run", "--providers", "flamia:bf16", "--modes", "train", "--workloads", "eq4x4k"]
# A comment line added to flamia/__init__.py: applies to this checkout, changes no behaviour.
ADD = """--- a/flamia/__init__.py
+++ b/flamia/__init__.py
@@ -1,1 +1,2 @@
+# stack_bench test level
 {first}
"""
BROKEN = """--- a/flamia/__init__.py
+++ b/flamia/__init__.py
@@ -1,1 +1,2 @@
+# never applies
 this line is not in the file
"""


def _run(tmp_path, *patches):
    files = []
    for i, text in enumerate(patches):
        f = tmp_path / f"{i + 1:04d}-level.patch"
        f.write_text(text)
        files.append(str(f))
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out)}
    run = subprocess.run(["bash", str(SCRIPT), *files, "--", *BENCH], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads((out / "stack.json").read_text()), (out / "stack.md").read_text(), run.stderr


def test_a_level_per_patch_and_a_broken_patch_ends_the_stack(tmp_path):
    first = (REPO / "flamia" / "__init__.py").read_text().splitlines()[0]
    stack, table, log = _run(tmp_path, ADD.format(first=first), BROKEN)
    assert stack["levels"] == ["base", "0001-level.patch"]
    assert sorted({r["level"] for r in stack["records"]}) == [0, 1]
    assert all(r["mode"] == "train" and r["workload"] == "eq4x4k" for r in stack["records"])
    assert "level 1" in table and "0001-level.patch" in table and "level 2" not in table
    assert "0002-level.patch does not apply" in log
