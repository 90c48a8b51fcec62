"""torch.compile of a projection and flamia on the GPU: every mode gives eager's output and
gradients bit for bit, and fullgraph traces without a break (the custom ops of flamia/ops.py).
The CPU suite checks the reference backend the same way (test_api.py)."""
import pytest
import torch

import flamia
from flamia.workload import make_packed_inputs

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

MODES = {"default": {}, "fullgraph": {"fullgraph": True}, "reduce-overhead": {"mode": "reduce-overhead"},
         "fullgraph-reduce-overhead": {"fullgraph": True, "mode": "reduce-overhead"}}


@pytest.mark.parametrize("mode, recipe", [*((mode, "mxfp8") for mode in MODES), ("default", "nvfp4"),
                                          ("fullgraph-reduce-overhead", "nvfp4"), ("fullgraph-reduce-overhead", "bf16")])
def test_compiled_step_equals_eager(mode, recipe):
    i = make_packed_inputs((300, 1, 77, 200), heads_q=8, heads_kv=2, head_dim=128, dtype=torch.bfloat16,
                           device="cuda")
    proj = torch.nn.Linear(128, 128, device="cuda", dtype=torch.bfloat16)

    def step(q, k, v):
        return flamia.flash_attn_varlen_func(proj(q), k, v, i.cu_seqlens, i.cu_seqlens, i.max_seqlen, i.max_seqlen,
                                             causal=True, recipe=recipe)

    torch._dynamo.reset()
    results = []
    for fn in (step, torch.compile(step, **MODES[mode])):
        for _ in range(3):  # reduce-overhead records its graph on a later call
            q, k, v = (x.detach().clone().requires_grad_() for x in (i.q, i.k, i.v))
            out = fn(q, k, v)
            grads = torch.autograd.grad(out, (q, k, v, proj.weight), i.do)
        results.append((out.detach().clone(), *grads))
    for name, eager, compiled in zip(("out", "dq", "dk", "dv", "dW"), *results):
        assert torch.equal(eager, compiled), name
