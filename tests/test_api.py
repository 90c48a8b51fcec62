"""The public API: every bad input is refused naming its argument; defaults resolve as
documented; the batched entry point is the varlen one on equal-length documents."""
import math

import pytest
import torch

import flamia
from flamia import RECIPES, Recipe, exact_attention, flash_attn_func, flash_attn_varlen_func
from flamia.validation import check_head_dim, resolve_backend

LENGTHS = [5, 0, 7]
HQ, HKV, D = 4, 2, 32


def cu_seqlens(lengths, dtype=torch.int32):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=dtype)


def varlen_args(head_dim=D, dtype=torch.bfloat16):
    gen = torch.Generator().manual_seed(0)
    total = sum(LENGTHS)
    return dict(
        q=torch.randn(total, HQ, head_dim, generator=gen).to(dtype),
        k=torch.randn(total, HKV, head_dim, generator=gen).to(dtype),
        v=torch.randn(total, HKV, head_dim, generator=gen).to(dtype),
        cu_seqlens_q=cu_seqlens(LENGTHS), cu_seqlens_k=cu_seqlens(LENGTHS),
        max_seqlen_q=max(LENGTHS), max_seqlen_k=max(LENGTHS))


def batched_args(batch=2, seq_q=6, seq_k=9, dtype=torch.bfloat16):
    gen = torch.Generator().manual_seed(1)
    return dict(q=torch.randn(batch, seq_q, HQ, D, generator=gen).to(dtype),
                k=torch.randn(batch, seq_k, HKV, D, generator=gen).to(dtype),
                v=torch.randn(batch, seq_k, HKV, D, generator=gen).to(dtype))


def last_dim_strided(x):
    """Same values, head dim not contiguous."""
    return x.transpose(-1, -2).contiguous().transpose(-1, -2)


def with_(**changes):
    return lambda a: {**a, **changes}


def changed(name, fn):
    return lambda a: {**a, name: fn(a[name])}


ABLATION = Recipe("mxfp8", per_tensor_scales=True)

# id: (change to the good varlen arguments, exception, argument named first in the message)
VARLEN_CASES = {
    "q_not_tensor": (changed("q", lambda x: x.tolist()), TypeError, "q"),
    "k_not_tensor": (with_(k=None), TypeError, "k"),
    "v_not_tensor": (changed("v", lambda x: x.float().numpy()), TypeError, "v"),
    "q_float64": (changed("q", lambda x: x.double()), ValueError, "q"),
    "all_int8": (lambda a: {**a, **{n: a[n].to(torch.int8) for n in "qkv"}}, ValueError, "q"),
    "k_dtype_mismatch": (changed("k", lambda x: x.half()), ValueError, "k"),
    "v_dtype_mismatch": (changed("v", lambda x: x.float()), ValueError, "v"),
    "q_4d": (changed("q", lambda x: x[None]), ValueError, "q"),
    "v_2d": (changed("v", lambda x: x[:, 0]), ValueError, "v"),
    "k_head_dim": (changed("k", lambda x: x[..., :16]), ValueError, "k"),
    "v_head_dim": (changed("v", lambda x: x[..., :16].contiguous()), ValueError, "v"),
    "head_dim_not_multiple_of_16": (lambda a: varlen_args(head_dim=24), ValueError, "q"),
    "head_dim_over_256": (lambda a: varlen_args(head_dim=272), ValueError, "q"),
    "hadamard_head_dim": (with_(recipe=Recipe("mxfp8", hadamard=True)), ValueError, "recipe"),
    "heads_not_divisible": (changed("q", lambda x: x[:, :3]), ValueError, "k"),
    "kv_heads_differ": (changed("v", lambda x: x[:, :1]), ValueError, "v"),
    "kv_tokens_differ": (changed("v", lambda x: x[:-1]), ValueError, "v"),
    "q_no_tokens": (lambda a: {**a, "q": a["q"][:0], "cu_seqlens_q": cu_seqlens([0, 0, 0])}, ValueError, "q"),
    "k_no_heads": (lambda a: {**a, "k": a["k"][:, :0], "v": a["v"][:, :0]}, ValueError, "k"),
    "k_other_device": (changed("k", lambda x: x.to("meta")), ValueError, "k"),
    "v_other_device": (changed("v", lambda x: x.to("meta")), ValueError, "v"),
    "q_head_dim_strided": (changed("q", last_dim_strided), ValueError, "q"),
    "v_head_dim_strided": (changed("v", last_dim_strided), ValueError, "v"),
    "cu_q_int64": (with_(cu_seqlens_q=cu_seqlens(LENGTHS, torch.int64)), ValueError, "cu_seqlens_q"),
    "cu_k_not_tensor": (with_(cu_seqlens_k=[0, 5, 5, 12]), TypeError, "cu_seqlens_k"),
    "cu_k_2d": (changed("cu_seqlens_k", lambda x: x[None]), ValueError, "cu_seqlens_k"),
    "cu_q_one_entry": (changed("cu_seqlens_q", lambda x: x[:1]), ValueError, "cu_seqlens_q"),
    "cu_q_other_device": (changed("cu_seqlens_q", lambda x: x.to("meta")), ValueError, "cu_seqlens_q"),
    "cu_q_first_not_zero": (with_(cu_seqlens_q=torch.tensor([1, 5, 5, 12], dtype=torch.int32)),
                            ValueError, "cu_seqlens_q"),
    "cu_k_decreasing": (with_(cu_seqlens_k=torch.tensor([0, 7, 5, 12], dtype=torch.int32)),
                        ValueError, "cu_seqlens_k"),
    "cu_k_last_not_total": (with_(cu_seqlens_k=torch.tensor([0, 5, 5, 11], dtype=torch.int32)),
                            ValueError, "cu_seqlens_k"),
    "cu_lengths_differ": (with_(cu_seqlens_k=cu_seqlens([5, 7])), ValueError, "cu_seqlens_k"),
    "max_seqlen_q_zero": (with_(max_seqlen_q=0), ValueError, "max_seqlen_q"),
    "max_seqlen_k_float": (with_(max_seqlen_k=7.0), TypeError, "max_seqlen_k"),
    "max_seqlen_q_bool": (with_(max_seqlen_q=True), TypeError, "max_seqlen_q"),
    "max_seqlen_q_too_small": (with_(max_seqlen_q=6), ValueError, "max_seqlen_q"),
    "max_seqlen_k_too_small": (with_(max_seqlen_k=4), ValueError, "max_seqlen_k"),
    "softmax_scale_zero": (with_(softmax_scale=0.0), ValueError, "softmax_scale"),
    "softmax_scale_negative": (with_(softmax_scale=-0.1), ValueError, "softmax_scale"),
    "softmax_scale_inf": (with_(softmax_scale=math.inf), ValueError, "softmax_scale"),
    "softmax_scale_nan": (with_(softmax_scale=math.nan), ValueError, "softmax_scale"),
    "softmax_scale_str": (with_(softmax_scale="0.1"), TypeError, "softmax_scale"),
    "window_below_minus_one": (with_(window_size=(-2, 0)), ValueError, "window_size"),
    "window_one_entry": (with_(window_size=(4,)), ValueError, "window_size"),
    "window_float": (with_(window_size=(4.0, 0)), ValueError, "window_size"),
    "window_int": (with_(window_size=4), ValueError, "window_size"),
    "causal_int": (with_(causal=1), TypeError, "causal"),
    "return_lse_str": (with_(return_lse="yes"), TypeError, "return_lse"),
    "recipe_unknown": (with_(recipe="mxfp9"), ValueError, "recipe"),
    "recipe_wrong_type": (with_(recipe=8), TypeError, "recipe"),
    "backend_unknown": (with_(backend="cuda"), ValueError, "backend"),
    "backend_wrong_type": (with_(backend=1), TypeError, "backend"),
    "triton_without_cuda": (with_(backend="triton"), ValueError, "backend"),
    "triton_nvfp4": (with_(backend="triton", recipe="nvfp4"), ValueError, "backend"),
    "triton_bf16_hadamard": (with_(backend="triton", recipe=RECIPES["bf16"].with_(hadamard=True)), ValueError,
                             "backend"),
    "triton_ablation": (with_(backend="triton", recipe=ABLATION), ValueError, "backend"),
    "validate_values_str": (with_(validate_values="yes"), TypeError, "validate_values"),
}

BATCHED_CASES = {
    "q_3d": (changed("q", lambda x: x[0]), ValueError, "q"),
    "k_strided": (changed("k", last_dim_strided), ValueError, "k"),
    "batch_differs": (lambda a: {**a, "k": a["k"][:1], "v": a["v"][:1]}, ValueError, "k"),
    "v_seqlen_differs": (changed("v", lambda x: x[:, :-1]), ValueError, "v"),
    "q_empty_sequence": (changed("q", lambda x: x[:, :0]), ValueError, "q"),
    "k_empty_sequence": (lambda a: {**a, "k": a["k"][:, :0], "v": a["v"][:, :0]}, ValueError, "k"),
    "batched_recipe_unknown": (with_(recipe="fp8"), ValueError, "recipe"),
    "batched_window": (with_(window_size=(1, 2, 3)), ValueError, "window_size"),
}


@pytest.fixture
def spy_reference(monkeypatch):
    """Stands in for the custom ops (flamia.ops.attention): records every call's resolved
    description and answers with the exact reference in the emulator's output dtypes (out in
    q's dtype, lse fp32)."""
    calls = []

    def attention(q, k, v, spec, backend):
        calls.append(dict(max_seqlen=(spec.max_seqlen_q, spec.max_seqlen_k), causal=spec.causal,
                          scale=spec.softmax_scale, window=spec.window_size, recipe=spec.recipe, backend=backend))
        out, lse = exact_attention(q, k, v, spec.cu_seqlens_q, spec.cu_seqlens_k, spec.max_seqlen_q,
                                   spec.max_seqlen_k, spec.causal, spec.softmax_scale, spec.window_size)
        return out.to(q.dtype), lse.float()

    monkeypatch.setattr(flamia.ops, "attention", attention)
    return calls


def assert_raises_naming(fn, kwargs, exc, name):
    with pytest.raises(exc) as info:
        fn(**kwargs)
    assert str(info.value).startswith(f"{name}: "), str(info.value)


@pytest.mark.parametrize("case", list(VARLEN_CASES))
def test_varlen_bad_input(case, spy_reference):
    change, exc, name = VARLEN_CASES[case]
    assert_raises_naming(flash_attn_varlen_func, change(varlen_args()), exc, name)
    assert not spy_reference, "a refused call must not reach a backend"


@pytest.mark.parametrize("case", list(BATCHED_CASES))
def test_batched_bad_input(case, spy_reference):
    change, exc, name = BATCHED_CASES[case]
    assert_raises_naming(flash_attn_func, change(batched_args()), exc, name)
    assert not spy_reference


def test_good_inputs_reach_the_reference_with_defaults_resolved(spy_reference):
    args = varlen_args()
    out = flash_attn_varlen_func(**args, window_size=[3, -1])
    (call,) = spy_reference
    assert call["scale"] == 1 / math.sqrt(D) and call["recipe"] is RECIPES["mxfp8"]
    assert call["window"] == (3, -1) and call["causal"] is False and call["backend"] == "reference"
    assert torch.is_tensor(out) and out.shape == args["q"].shape and out.dtype == torch.bfloat16


def test_value_checks_follow_validate_values(spy_reference):
    bad = {**varlen_args(), "cu_seqlens_k": torch.tensor([0, 5, 5, 11], dtype=torch.int32)}
    # Lengths stay within max_seqlen_k and rows within k, so the unchecked call is harmless.
    flash_attn_varlen_func(**bad, validate_values=False)
    assert len(spy_reference) == 1
    assert_raises_naming(flash_attn_varlen_func, {**bad, "validate_values": True}, ValueError, "cu_seqlens_k")


@pytest.mark.parametrize("causal", [False, True])
def test_batched_equals_varlen(causal, spy_reference):
    args = batched_args(batch=3, seq_q=6, seq_k=9)
    q, k, v = args["q"], args["k"], args["v"]
    out, lse = flash_attn_func(q, k, v, causal=causal, softmax_scale=0.2, recipe="bf16", return_lse=True)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == (3, HQ, 6) and lse.dtype == torch.float32
    for b in range(3):
        one = torch.tensor([0, 6], dtype=torch.int32), torch.tensor([0, 9], dtype=torch.int32)
        ref_out, ref_lse = flash_attn_varlen_func(q[b], k[b], v[b], *one, 6, 9, causal=causal,
                                                  softmax_scale=0.2, recipe="bf16", return_lse=True)
        assert torch.equal(out[b], ref_out) and torch.equal(lse[b], ref_lse)
    assert spy_reference[0]["max_seqlen"] == (6, 9) and spy_reference[0]["recipe"] is RECIPES["bf16"]


def test_batched_with_emulator():
    args = batched_args(batch=2, seq_q=40, seq_k=40)
    args = {n: x.requires_grad_() for n, x in args.items()}
    out, lse = flash_attn_func(**args, causal=True, recipe="bf16", backend="reference", return_lse=True)
    assert out.shape == args["q"].shape and out.dtype == torch.bfloat16
    assert lse.shape == (2, HQ, 40) and lse.dtype == torch.float32
    flat = {n: x.detach().flatten(0, 1) for n, x in args.items()}
    cu = torch.tensor([0, 40, 80], dtype=torch.int32)
    ref = flash_attn_varlen_func(**flat, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=40, max_seqlen_k=40,
                                 causal=True, recipe="bf16", backend="reference")
    assert torch.equal(out.flatten(0, 1), ref)
    out.float().sum().backward()
    assert all(x.grad is not None and x.grad.shape == x.shape for x in args.values())


def test_backend_resolution_on_cpu():
    q = torch.zeros(4, 2, 64)
    for recipe in RECIPES.values():
        assert resolve_backend(None, recipe, q) == "reference"
    assert resolve_backend("reference", RECIPES["mxfp8"], q) == "reference"


def test_triton_head_dims():
    with pytest.raises(ValueError, match=r"^q: head_dim 96"):
        check_head_dim(96, "triton", RECIPES["mxfp8"])
    check_head_dim(96, "reference", RECIPES["mxfp8"])
    check_head_dim(128, "triton", RECIPES["mxfp8"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_backend_resolution_on_cuda():
    q = torch.zeros(4, 2, 64, device="cuda")
    assert resolve_backend(None, RECIPES["mxfp8"], q) == "triton"
    assert resolve_backend(None, RECIPES["bf16"], q) == "triton"
    assert resolve_backend(None, RECIPES["nvfp4"], q) == "triton"
    assert resolve_backend(None, RECIPES["nvfp4"].with_(p4_sum_quantized=True), q) == "triton"
    assert resolve_backend(None, RECIPES["fp4"], q) == "triton"
    assert resolve_backend(None, ABLATION, q) == "reference"
    assert resolve_backend(None, RECIPES["bf16"].with_(hadamard=True), q) == "reference"
    assert resolve_backend("triton", RECIPES["mxfp8"], q) == "triton"
    assert resolve_backend("triton", RECIPES["bf16"], q) == "triton"
    assert resolve_backend("triton", RECIPES["fp4"], q) == "triton"
    with pytest.raises(ValueError, match="^backend: .triton. runs the bf16 recipe without the Hadamard"):
        resolve_backend("triton", RECIPES["bf16"].with_(hadamard=True), q)


def test_kernels_run_the_flag_ablations_bf16():
    """bf16's score sums are inexact: its approximate exponential stays with the emulator."""
    with pytest.raises(ValueError, match="runs no ablation"):
        resolve_backend("triton", RECIPES["bf16"].with_(fwd_approx_exp=True), torch.zeros(4, 2, 64))


@pytest.mark.parametrize("changes, runs", [
    (dict(fwd_p4_bwd_p8=True), True), (dict(fwd_diag_block_m=256), True),
    (dict(p4_scale_before_mask=True, p4_sum_quantized=True), True), (dict(fwd_diag_block_m=96), False),
    (dict(fwd_approx_exp=True), True), (dict(fwd_approx_exp=True, p4_scale_before_mask=True), False),
    (dict(per_tensor_scales=True), False)])
def test_kernels_run_the_flag_ablations(changes, runs):
    """fwd_approx_exp and nvfp4's fwd_p4_bwd_p8, fwd_diag_block_m (a multiple of the kernels'
    64-row query tiles) and p4_scale_before_mask are flags of the kernels; other ablations
    stay with the emulator. On a CPU tensor the triton backend then stops at the device check,
    or earlier at the recipe."""
    q = torch.zeros(4, 2, 64)
    match = "needs CUDA" if runs else "runs no ablation|multiple of its query tiles"
    with pytest.raises(ValueError, match=match):
        resolve_backend("triton", RECIPES["nvfp4"].with_(**changes), q)


def test_public_surface():
    for name in flamia.__all__:
        assert hasattr(flamia, name), name


@pytest.mark.parametrize("recipe", ["mxfp8", "bf16"])
def test_torch_compile_fullgraph_gives_eager_bits(recipe):
    """torch.compile(fullgraph=True) of a function calling flamia (the emulator: on the CPU the
    custom ops run the reference backend) traces without a graph break and gives eager's
    output and gradients bit for bit."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(40, 2, 64, generator=g).requires_grad_() for _ in range(3))
    cu = torch.tensor([0, 17, 40], dtype=torch.int32)

    def step(q, k, v):
        return flamia.flash_attn_varlen_func(q, k, v, cu, cu, 23, 23, causal=True, recipe=recipe)

    torch._dynamo.reset()
    results = []
    for fn in (step, torch.compile(step, fullgraph=True)):
        out = fn(q, k, v)
        results.append((out.detach(), *torch.autograd.grad(out.float().square().sum(), (q, k, v))))
    for eager, compiled in zip(*results):
        assert torch.equal(eager, compiled)


def test_autocast_leaves_the_emulator_numerics_alone():
    """Under autocast the custom op runs the recipe's numerics, not autocast's bf16 matmuls."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(40, 2, 64, generator=g) for _ in range(3))
    cu = torch.tensor([0, 17, 40], dtype=torch.int32)
    plain = flamia.flash_attn_varlen_func(q, k, v, cu, cu, 23, 23, causal=True, recipe="bf16")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast = flamia.flash_attn_varlen_func(q, k, v, cu, cu, 23, 23, causal=True, recipe="bf16")
    assert torch.equal(plain, cast)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's path; on the GPU: tests/test_kernel_ops.py")
@pytest.mark.parametrize("head_dim", [64, 128])
def test_bf16_triton_backend_matches_emulator(head_dim):
    """The bf16 recipe's training call on the kernels (kernels/ops.py: the bf16 quantizers,
    forward and backward, the Triton twins on the interpreter) against the emulator, on odd
    lengths with an empty and a one-token document and GQA: O within one bf16 ulp where fp32
    summation order moves a rounding, the gradients within the bound of
    tests/test_kernel_bwd.py's BF16_GRAD_TOL (2^-8 of their largest element)."""
    from flamia.ops import attention
    from flamia.spec import AttnSpec

    g = torch.Generator().manual_seed(head_dim)
    cu = torch.tensor([0, 37, 38, 38, 100], dtype=torch.int32)
    spec = AttnSpec(cu, cu, 62, 62, True, head_dim ** -0.5, (-1, -1), RECIPES["bf16"])
    q = torch.randn(100, 4, head_dim, generator=g).bfloat16().requires_grad_()
    k, v = (torch.randn(100, 2, head_dim, generator=g).bfloat16().requires_grad_() for _ in range(2))
    do = torch.randn(100, 4, head_dim, generator=g).bfloat16()
    results = []
    for backend in ("triton", "reference"):
        out, lse = attention(q, k, v, spec, backend)
        results.append((out.detach(), lse, *torch.autograd.grad(out, (q, k, v), do)))
    (out, lse, *grads), (out_ref, lse_ref, *grads_ref) = results
    assert torch.equal(torch.isinf(lse), torch.isinf(lse_ref))
    ulp = 2.0 ** (torch.floor(torch.log2(out_ref.float().abs().clamp_min(2.0**-126))) - 7)
    assert ((out.float() - out_ref.float()).abs() <= ulp).all()
    for name, a, b in zip(("dq", "dk", "dv"), grads, grads_ref):
        assert a.dtype == torch.bfloat16, name
        err = ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()
        assert err <= 2.0**-8, f"{name}: {err:.3g}"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's path; on the GPU: tests/test_compile.py")
@pytest.mark.parametrize("recipe", ["mxfp8", "bf16"])
def test_triton_backend_compiles_with_eager_bits(recipe):
    """The triton backend's custom ops under torch.compile(fullgraph=True): their fake
    residuals match the real ones (bf16's leave out the transposed Q and K codes), and out and
    every gradient equal the eager path's. Without
    CUDA the Triton twins of the kernels run on the interpreter (through flamia.ops, since the
    public API refuses the triton backend on CPU tensors)."""
    from flamia.ops import attention
    from flamia.spec import AttnSpec

    g = torch.Generator().manual_seed(2)
    cu = torch.tensor([0, 37, 38, 100], dtype=torch.int32)
    spec = AttnSpec(cu, cu, 62, 62, True, 64 ** -0.5, (-1, -1), RECIPES[recipe])
    q, k, v = (torch.randn(100, 2, 64, generator=g).bfloat16().requires_grad_() for _ in range(3))
    do = torch.randn(100, 2, 64, generator=g).bfloat16()

    def step(q, k, v):
        return attention(q, k, v, spec, "triton")[0]

    torch._dynamo.reset()
    results = []
    for fn in (step, torch.compile(step, fullgraph=True)):
        out = fn(q, k, v)
        results.append((out.detach(), *torch.autograd.grad(out, (q, k, v), do)))
    for name, eager, compiled in zip(("out", "dq", "dk", "dv"), *results):
        assert torch.equal(eager, compiled), name
