"""examples/train_gpt.py runs end to end on the CPU (2 steps on a tiny generated text) and
says in one line how to build a missing data file."""
import importlib.util
import random
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "train_gpt.py"


def load_script():
    spec = importlib.util.spec_from_file_location("train_gpt", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_train_gpt_two_steps(tmp_path, capsys):
    rng = random.Random(0)
    words = "the of and to in a is that for it as was with be by on not he this are".split()
    text = "\n\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(3, 40))) for _ in range(120))
    data = tmp_path / "tiny.txt"
    data.write_text(text)
    load_script().main(["--data", str(data), "--device", "cpu", "--steps", "2", "--context", "64", "--n-layer", "1", "--d-model", "32",
                        "--batch-size", "2", "--eval-batches", "1", "--log-every", "1", "--no-compile"])
    lines = capsys.readouterr().out.splitlines()
    steps = [line for line in lines if line.startswith("step")]
    assert len(steps) == 2 and all("tokens/s" in line for line in steps)
    assert lines[-1].startswith("validation loss")


def test_train_gpt_missing_data(tmp_path):
    missing = tmp_path / "english-text.txt"
    with pytest.raises(SystemExit) as exit_info:
        load_script().main(["--data", str(missing), "--device", "cpu"])
    message = str(exit_info.value.code)
    assert message.startswith(f"data: no such file {missing}") and "python -m flamia.data" in message
    assert "\n" not in message
