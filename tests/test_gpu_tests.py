"""benchmarks/gpu_tests.py, the gate's test runner: it deals the gpu-marked tests into shards,
streams their lines with the shard's number and elapsed seconds, and sums the counts on its
last line in pytest's words, which gpu_gate.sh reads."""
import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_tests.py"
GATE = SCRIPT.with_name("gpu_gate.sh")

_TESTS = '''
import pytest

@pytest.mark.gpu
@pytest.mark.parametrize("i", range(5))
def test_marked(i):
    assert i != 3

def test_unmarked():
    pass
'''


def test_shards_stream_and_sum_their_counts(tmp_path):
    (tmp_path / "test_fake.py").write_text(_TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: needs a GPU\n")
    run = subprocess.run([sys.executable, str(SCRIPT), "--shards", "2", "test_fake.py"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    lines = run.stdout.splitlines()
    assert run.returncode == 1, run.stdout[-2000:] + run.stderr[-2000:]
    assert re.fullmatch(r"4 passed, 1 failed in [\d.]+s \(5 tests, 2 shards\)", lines[-1]), lines[-1]
    shard_lines = [line for line in lines[:-1] if line.startswith("[")]
    assert {line[:3] for line in shard_lines} == {"[0]", "[1]"}
    assert all(re.match(r"\[\d\] +[\d.]+s ", line) for line in shard_lines)
    # the failure as gpu_gate.sh's own pattern finds it
    pattern = re.search(r're\.findall\(r"(.*FAILED.*?)", text', GATE.read_text()).group(1)
    assert re.findall(pattern, run.stdout, re.M) == ["test_fake.py::test_marked[3]"]
