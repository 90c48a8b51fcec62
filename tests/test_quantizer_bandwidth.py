"""benchmarks/quantizer_bandwidth.py times the quantizer launches that a training call makes,
no more and no fewer (the interpreter's launches)."""
import contextlib
import sys
from pathlib import Path

import pytest
import torch
from triton.runtime.interpreter import InterpretedFunction

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import quantizer_bandwidth  # noqa: E402

from flamia.bench.workloads import Workload, make_case  # noqa: E402
from flamia.kernels import ops as kernel_ops  # noqa: E402
from flamia.recipes import RECIPES  # noqa: E402
from flamia.spec import AttnSpec  # noqa: E402

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's launches; the GPU runs the script")


@contextlib.contextmanager
def _launched(monkeypatch):
    """The names of the kernels launched inside, one per launch."""
    names, run = [], InterpretedFunction.run

    def record(self, *args, **kwargs):
        names.append(self.fn.__name__)
        return run(self, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(InterpretedFunction, "run", record)
        yield names


@pytest.mark.parametrize("recipe", ["mxfp8", "nvfp4", "fp4", "bf16"])
def test_times_the_training_calls_quantizer_launches(recipe, monkeypatch):
    case = make_case(Workload("tiny", (37, 64), heads_q=2, heads_kv=2, head_dim=64), "cpu")
    i = case.inputs
    launches = quantizer_bandwidth.launches_of(case, recipe)
    with _launched(monkeypatch) as timed:
        for fn in launches.values():
            fn()
    spec = AttnSpec(i.cu_seqlens, i.cu_seqlens, 64, 64, True, 0.125, (-1, -1), RECIPES[recipe])
    with _launched(monkeypatch) as call:
        out, _, res = kernel_ops.forward(i.q, i.k, i.v, spec)
        kernel_ops.backward(i.do, out, res, spec)
    assert len(timed) == len(launches)
    others = list(call)
    for name in timed:
        others.remove(name)  # ValueError: a launch the call does not make
    # fp4's stochastic G: its rows' random-word parts, not a quantizer
    row_parts = ("_row_parts_kernel",) if recipe == "fp4" else ()
    assert sorted(others) == sorted(("_plan_kernel", "_prefix_v_kernel", "_attn_fwd_kernel", "_dkdv_kernel",
                                     "_dq_kernel", *row_parts))
