"""Importing a benchmark script changes nothing in the importing process's environment: the
tests import several, and pytest collects every module before it runs a test, so a script that
set TRITON_INTERPRET at import turned the kernels that a GPU run decorates later into
interpreted ones, and those tests failed to compile."""
import os
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"

_IMPORT_ALL = """
import importlib, os, sys
sys.path.insert(0, sys.argv[1])
before = dict(os.environ)
for name in sys.argv[2:]:
    importlib.import_module(name)
    changed = sorted(k for k in set(os.environ) | set(before) if os.environ.get(k) != before.get(k))
    if changed:
        sys.exit(f"importing {name} changed {changed}")
"""


def test_importing_a_benchmark_script_leaves_the_environment():
    names = sorted(p.stem for p in BENCHMARKS.glob("*.py"))
    assert "memory_account" in names
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", _IMPORT_ALL, str(BENCHMARKS), *names], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
