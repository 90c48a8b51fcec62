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


def _run_fake_tests(tmp_path, *options: str) -> subprocess.CompletedProcess:
    """gpu_tests.py over _TESTS in two shards, from tmp_path."""
    (tmp_path / "test_fake.py").write_text(_TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: needs a GPU\n")
    return subprocess.run([sys.executable, str(SCRIPT), "--shards", "2", *options, "test_fake.py"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)


def test_shards_stream_and_sum_their_counts(tmp_path):
    run = _run_fake_tests(tmp_path)
    lines = run.stdout.splitlines()
    assert run.returncode == 1, run.stdout[-2000:] + run.stderr[-2000:]
    assert re.fullmatch(r"4 passed, 1 failed in [\d.]+s \(5 tests, 2 shards\)", lines[-1]), lines[-1]
    shard_lines = [line for line in lines[:-1] if line.startswith("[")]
    assert {line[:3] for line in shard_lines} == {"[0]", "[1]"}
    assert all(re.match(r"\[\d\] +[\d.]+s ", line) for line in shard_lines)
    # the failure as gpu_gate.sh's own pattern finds it
    pattern = re.search(r're\.findall\(r"(.*FAILED.*?)", text', GATE.read_text()).group(1)
    assert re.findall(pattern, run.stdout, re.M) == ["test_fake.py::test_marked[3]"]


def _gate_parse(tmp_path, kind: str, text: str, rc: int) -> str:
    """gpu_gate.sh's parse() (its Python, run as the gate runs it) on a log holding ``text``."""
    body = re.search(r"<<'PYEOF'\n(.*?)\nPYEOF", GATE.read_text(), re.S).group(1)
    log = tmp_path / "step.log"
    log.write_text(text)
    run = subprocess.run([sys.executable, "-", kind, str(log), str(rc)], input=body, capture_output=True, text=True,
                         timeout=60, env={"GATE_ROOT": str(GATE.parents[1]), "PATH": ""})
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


def test_a_timed_out_run_is_counted_from_its_streamed_lines(tmp_path):
    """A timeout leaves no summed last line (and a shard that finished leaves its own pytest
    summary, which is not the run's): the gate counts the streamed results instead."""
    run = _run_fake_tests(tmp_path)
    sys.path.insert(0, str(SCRIPT.parent))
    from gpu_tests import streamed_counts
    assert streamed_counts(run.stdout) == {"passed": 4, "failed": 1, "collected": 5}
    assert _gate_parse(tmp_path, "pytest", run.stdout, 1).startswith("FAIL\t4 passed, 1 failed;")
    # cut after the first shard's results: what a timeout leaves
    first = [line for line in run.stdout.splitlines() if not line.startswith("[1]")][:-1]
    text = "\n".join(first) + "\n"
    shown = streamed_counts(text)
    assert shown["collected"] == 5 and 0 < shown["passed"] + shown.get("failed", 0) < 5
    note = _gate_parse(tmp_path, "pytest", text, 124)
    assert note == (f"FAIL\t{shown['passed']} of 5 passed, {shown.get('failed', 0)} failed; timed out"
                    + "".join(f"; FAILED {t}" for t in re.findall(r"(\S+) FAILED", text))), note


def test_the_device_tests_step_runs_the_unmarked_tests_of_the_modules_that_take_cuda(tmp_path):
    """The gate's device-tests step: --marker "not gpu" deals out the other tests, and its grep
    finds the test modules that run on CUDA when it is present."""
    run = _run_fake_tests(tmp_path, "--marker", "not gpu")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert run.stdout.splitlines()[0] == "collected 1 tests (-m not gpu), 1 shards"
    assert re.fullmatch(r"1 passed in [\d.]+s \(1 tests, 1 shards\)", run.stdout.splitlines()[-1])
    grep = re.search(r"grep -l '.*?' tests/test_\*\.py", GATE.read_text()).group(0)
    found = subprocess.run(["bash", "-c", grep], cwd=GATE.parents[1], capture_output=True, text=True).stdout.split()
    assert {"tests/test_stochastic.py", "tests/test_kernel_bwd.py", "tests/test_kernel_quantize.py"} <= set(found)
