"""The whole MXFP8, BF16, mixed NVFP4 and all-4-bit training calls (flamia/kernels/ops.py: quantizers, forward,
backward with the in-kernel rotate-back and output cast) against the emulator, on odd packed
lengths with GQA: on the GPU through the public API for bf16 and fp16 inputs, and under the
interpreter through kernels/ops.py for bf16 inputs. test_kernel_*.py check each kernel against
the emulator; this checks the glue between them."""
import pytest
import torch

import flamia
from flamia.kernels import ops as kernel_ops
from flamia.kernels import replay
from flamia.kernels.configs import grad_mode
from flamia.recipes import Recipe, resolve_recipe
from flamia.spec import AttnSpec
from flamia.workload import as_attention, make_packed_inputs, training_call

# bf16_scores on both routes, l from p (p_sum_codes=False), and the mismatch ablations' flags (flamia.train's RUNS)
OPTIONS = {"mxfp8-bf16s": Recipe("mxfp8", bf16_scores=True), "nvfp4-bf16s": Recipe("nvfp4", bf16_scores=True),
               "nvfp4-bf16s-sumq": Recipe("nvfp4", bf16_scores=True, p4_sum_quantized=True),
               "nvfp4-bf16s-prepr": Recipe("nvfp4", bf16_scores=True, fwd_p4_bwd_p8=True),
               "mxfp8-bf16s-exp": Recipe("mxfp8", bf16_scores=True, fwd_approx_exp=True),
               "mxfp8-from-p": Recipe("mxfp8", p_sum_codes=False), "nvfp4-from-p": Recipe("nvfp4", p_sum_codes=False),
               "nvfp4-sumc-prepr": Recipe("nvfp4", p_sum_codes=True, fwd_p4_bwd_p8=True),
               "mxfp8-sumc-exp": Recipe("mxfp8", p_sum_codes=True, fwd_approx_exp=True)}


def _recipe_id(value):
    return next((name for name, recipe in OPTIONS.items() if value == recipe), None)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's exact products; the GPU test covers CUDA")
@pytest.mark.parametrize("recipe, head_dim, causal, window, dtype", [
    ("mxfp8", 64, True, (-1, -1), torch.bfloat16), ("nvfp4", 64, True, (-1, -1), torch.bfloat16),
    ("bf16", 64, True, (-1, -1), torch.bfloat16), ("fp4", 64, True, (-1, -1), torch.bfloat16),
    ("fp4", 128, True, (20, 0), torch.bfloat16), ("fp4", 64, False, (-1, -1), torch.bfloat16),
    ("mxfp8", 64, True, (-1, -1), torch.float16),
    *((recipe, d, True, (-1, -1), torch.bfloat16) for recipe in OPTIONS.values() for d in (64, 128))],
    ids=_recipe_id)
def test_interpreted_training_call_equals_emulator(recipe, head_dim, causal, window, dtype):
    """kernels/ops.py's forward and backward under the interpreter take 5 and 3 launches (4 with
    a stochastic G; each one host time an eager call pays) and equal the emulator's O, dQ, dK, dV bit for bit (the
    stochastic fp4 G with the same seed on both sides), fp16 inputs too (O rounds once, from
    fp32 to fp16, and the backward's delta reads that O); bf16 within 1e-6 relative norm, the
    order of fp32 sums in its unquantized products. bf16_scores' BF16 score products sum in
    another order too, which can move an output across a rounding, and with it a P code (a
    4-bit one by up to a third): at most 1 element in 1000 off, within 1e-4 relative norm
    (measured on 338 tokens: up to 25 of dQ's 86528 elements, relative norm up to 5e-5)."""
    inputs = make_packed_inputs((37, 1, 70), 4, 2, head_dim, dtype=dtype, seed=3, device="cpu")
    cu, n, scale = inputs.cu_seqlens, inputs.max_seqlen, head_dim ** -0.5
    spec = AttnSpec(cu, cu, n, n, causal, scale, window, resolve_recipe(recipe), seed=5)
    with replay.record() as (forward, _):
        out, _, res = kernel_ops.forward(inputs.q, inputs.k, inputs.v, spec)
    with replay.record() as (backward, _):
        got = (out, *kernel_ops.backward(inputs.do, out, res, spec))
    # plan, Q and K, V, PV, forward; dO, a stochastic G's row parts (random_bits.grad_row_parts), dK/dV,
    # dQ (bf16 Q and K are the bf16 route's own codes: no Q and K)
    n_backward = 4 if grad_mode(spec.recipe) == 2 else 3
    assert (len(forward), len(backward)) == (4 if kernel_ops.inputs_are_codes(spec.recipe, dtype) else 5, n_backward)
    q, k, v = (x.detach().clone().requires_grad_() for x in (inputs.q, inputs.k, inputs.v))
    want_out = flamia.flash_attn_varlen_func(q, k, v, cu, cu, n, n, causal=causal, softmax_scale=scale,
                                             window_size=window, recipe=recipe, backend="reference", seed=5)
    want = (want_out, *torch.autograd.grad(want_out, (q, k, v), inputs.do))
    for name, a, b in zip(("O", "dQ", "dK", "dV"), got, want):
        assert a.dtype == b.dtype == dtype, name
        if recipe == "bf16":
            err = ((a.double() - b.double()).norm() / b.double().norm()).item()
            assert err <= 1e-6, f"{name}: relative norm error {err:.3g}"
        elif _recipe_id(recipe):
            err = ((a.double() - b.double()).norm() / b.double().norm()).item()
            assert (a != b).float().mean() <= 1e-3 and err <= 1e-4, f"{name}: {(a != b).sum()} off, {err:.3g}"
        else:
            assert torch.equal(a, b), name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("recipe", ["mxfp8", "bf16", "nvfp4", "fp4", OPTIONS["mxfp8-bf16s"], OPTIONS["mxfp8-from-p"],
                                    OPTIONS["nvfp4-bf16s"]], ids=_recipe_id)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("lengths", [(1000, 333, 1, 77), (5, 1, 9)], ids=["packed", "tiny"])
def test_training_call_matches_emulator(dtype, head_dim, lengths, recipe):
    """O, dQ, dK, dV within 1e-2 relative norm of the emulator (Hopper's FP8 MMA accumulates
    with reduced precision: 0.4-0.6% was measured at 4 x 4096), in the input dtype; nvfp4
    within 2e-2, since a score that lands on the other side of a rounding moves a 4-bit P
    code by a third of its value where E4M3's step is an eighth (measured on the H200: dQ
    1.23e-2 on the tiny batch, d=128, fp16; 2.9e-3 on the packed one). The tiny
    batch holds fewer tokens than one tile: the Gluon kernels' TMA boxes then reach past
    every tensor's end (zeros). fp4 (the same seed on both sides) and nvfp4 with bf16_scores
    take nvfp4's bound."""
    inputs = make_packed_inputs(lengths, heads_q=8, heads_kv=2, head_dim=head_dim, dtype=dtype, device="cuda")
    got = training_call(as_attention(recipe, "triton"), inputs)
    want = training_call(as_attention(recipe, "reference"), inputs)
    for name, a in got.by_name().items():
        b = want.by_name()[name]
        if name == "LSE":
            continue
        assert a.dtype == dtype, name
        err = ((a.double() - b.double()).norm() / b.double().norm()).item()
        bound = 2e-2 if resolve_recipe(recipe).has_p4 else 1e-2
        assert err <= bound, f"{name}: relative norm error {err:.3g}"
    out = flamia.flash_attn_varlen_func(inputs.q, inputs.k, inputs.v, inputs.cu_seqlens, inputs.cu_seqlens,
                                        inputs.max_seqlen, inputs.max_seqlen, causal=True, recipe=recipe)
    assert torch.equal(out, got.out), "backend=None did not pick the kernels"


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA")]), pytest.param("cpu", marks=pytest.mark.skipif(
        torch.cuda.is_available(), reason="the interpreter's path; the cuda case covers the GPU's"))])
def test_bf16_backward_reads_grad_output_as_its_codes(device, monkeypatch):
    """The bf16 route's backward reads a bf16 dO as its own codes (no dO^ written) where it is
    16-byte aligned, and writes dO^ for one that is not: the same gradients, bit for bit."""
    asked = []

    def spy(*args, **kwargs):
        asked.append(kwargs["own_codes"])
        return quantize_grad_output(*args, **kwargs)

    quantize_grad_output = kernel_ops.quantize_grad_output
    monkeypatch.setattr(kernel_ops, "quantize_grad_output", spy)
    inputs = make_packed_inputs((37, 1, 70), 4, 2, 64, dtype=torch.bfloat16, seed=4, device=device)
    cu, n = inputs.cu_seqlens, inputs.max_seqlen
    spec = AttnSpec(cu, cu, n, n, True, 0.125, (-1, -1), resolve_recipe("bf16"), seed=0)
    out, _, res = kernel_ops.forward(inputs.q, inputs.k, inputs.v, spec)
    shifted = torch.empty(inputs.do.numel() + 1, dtype=torch.bfloat16, device=device)[1:].view_as(inputs.do)
    shifted.copy_(inputs.do)
    assert inputs.do.data_ptr() % 16 == 0 and shifted.data_ptr() % 16 == 2
    own = kernel_ops.backward(inputs.do, out, res, spec)
    written = kernel_ops.backward(shifted, out, res, spec)
    assert asked == [True, False]
    for name, a, b in zip(("dQ", "dK", "dV"), own, written):
        assert torch.equal(a, b), name
