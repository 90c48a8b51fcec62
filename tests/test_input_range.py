"""Out-of-range inputs and autocast on the emulator (CPU): what NUMERICS.md's "Non-finite and
out-of-range inputs" documents.

- Scores beyond fp32's range: the fp32 scores x = (S * qf) * kf overflow to +-inf, as
  FlashAttention's fp32 scores do. A row with a +inf score gets O = NaN (inf - inf in
  exp2(x - m)); a row whose visible scores are all -inf reads as a row that sees no key
  (O = 0, LSE = +inf), silently, as in FlashAttention-2. Only the overflowing document is hit.
- Below the overflow, large inputs stay finite; tiny V entries (below 2^-110, under the
  clamped exponent -100) quantize to zero, so O is 0.
- autocast must not change the emulator: it computes in fp32 whatever the caller's autocast.
"""
import pytest
import torch

import flamia
from flamia.workload import as_attention, make_packed_inputs, training_call

NAMES = ("O", "LSE", "dQ", "dK", "dV")


def cu_seqlens(lengths) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def emulator_call(inputs, causal=True, recipe="mxfp8") -> dict[str, torch.Tensor]:
    return training_call(as_attention(recipe, "reference"), inputs, causal).by_name()


def test_scores_beyond_fp32_make_their_document_nan_and_no_other():
    """Document 1 all 1e30 (bf16): its scores overflow fp32, so its O, dQ, dK, dV are all NaN
    and its LSE +inf; document 0 is bitwise what it is next to a normal document. Exact
    attention computing in fp32 overflows the same way; in fp64 the answer (V) is finite."""
    clean = make_packed_inputs((17, 23), 2, 1, 64, torch.bfloat16, seed=4)
    rows = clean.doc_rows(1)
    big = clean.with_(**{n: getattr(clean, n).clone().index_fill_(0, torch.arange(rows.start, rows.stop), 1e30)
                         for n in ("q", "k", "v")})
    got, want = emulator_call(big), emulator_call(clean)
    for name in NAMES:
        assert torch.equal(got[name][:rows.start], want[name][:rows.start]), f"{name} of document 0 changed"
        assert torch.isfinite(got[name][:rows.start]).all()
    for name in ("O", "dQ", "dK", "dV"):
        assert torch.isnan(got[name][rows]).all(), f"{name} of the 1e30 document"
    assert torch.equal(got["LSE"][rows], torch.full_like(got["LSE"][rows], float("inf")))
    cu, n = big.cu_seqlens, big.max_seqlen
    exact32, _ = flamia.exact_attention(big.q, big.k, big.v, cu, cu, n, n, causal=True, dtype=torch.float32)
    exact64, _ = flamia.exact_attention(big.q, big.k, big.v, cu, cu, n, n, causal=True, dtype=torch.float64)
    assert torch.isnan(exact32[rows]).all() and torch.isfinite(exact64[rows]).all()


def test_rows_whose_scores_all_overflow_to_minus_inf_read_as_rows_without_keys():
    """One document of two tokens, causal: query 0 sees key 0 with a score of -1e60 (x = -inf
    in fp32), query 1 sees key 1 with +1e60 (x = +inf). Row 0 gets O = 0 and LSE = +inf, the
    marks of a row that sees no key (the true O is V's row 0); row 1 gets O = NaN."""
    d = 64
    q = torch.full((2, 1, d), 1e30).bfloat16()
    k = torch.tensor([-1e30, 1e30]).repeat_interleave(d).view(2, 1, d).bfloat16()
    v = torch.randn(2, 1, d, generator=torch.Generator().manual_seed(0)).bfloat16()
    cu = cu_seqlens([2])
    out, lse = flamia.flash_attn_varlen_func(q, k, v, cu, cu, 2, 2, causal=True, backend="reference",
                                             return_lse=True)
    assert not out[0].any() and lse[0, 0] == float("inf")
    assert torch.isnan(out[1]).all()
    exact, _ = flamia.exact_attention(q, k, v, cu, cu, 2, 2, causal=True, dtype=torch.float64)
    assert torch.equal(exact[0].to(v.dtype), v[0])


def test_large_scores_inside_fp32_stay_finite():
    """Q and K of random normal entries times 1e18 (bf16, d=64): every scaled score stays
    below 2^128, and every output and gradient is finite."""
    base = make_packed_inputs((40, 33), 2, 1, 64, torch.float32, seed=3)
    big = base.with_(q=(base.q * 1e18).bfloat16(), k=(base.k * 1e18).bfloat16(), v=base.v.bfloat16(),
                     do=base.do.bfloat16())
    got = emulator_call(big)
    for name in NAMES:
        assert torch.isfinite(got[name]).all(), name


def test_tiny_values_quantize_to_zero_below_the_exponent_clamp():
    """V entries of about 1e-30 keep the usual accuracy (their group exponent is -100, the
    clamp); at about 1e-34, below 2^-110 = 448 * 2^-100 / 2^19, every code is zero and O = 0."""
    base = make_packed_inputs((40, 33), 2, 1, 64, torch.float32, seed=3)

    def o_and_exact(scale):
        x = base.with_(q=base.q.bfloat16(), k=base.k.bfloat16(), v=(base.v * scale).bfloat16(), do=base.do.bfloat16())
        cu, n = x.cu_seqlens, x.max_seqlen
        out = flamia.flash_attn_varlen_func(x.q, x.k, x.v, cu, cu, n, n, causal=True, backend="reference")
        exact, _ = flamia.exact_attention(x.q, x.k, x.v, cu, cu, n, n, causal=True, dtype=torch.float64)
        return out, exact

    out, exact = o_and_exact(1e-30)
    assert ((out.double() - exact).norm() / exact.norm()).item() < 0.1
    out, exact = o_and_exact(1e-34)
    assert not out.any() and exact.abs().max() > 0


@pytest.mark.parametrize("recipe", list(flamia.RECIPES))
def test_emulator_ignores_autocast(recipe):
    """Forward and backward inside torch.autocast("cpu", bfloat16) equal them outside, bit for
    bit: autocast would run the emulator's fp32 products in bf16 (a different, unemulated
    numerics) and change every output."""
    inputs = make_packed_inputs((40, 7, 1), 2, 1, 64, torch.bfloat16, seed=0)
    want = emulator_call(inputs, recipe=recipe)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = emulator_call(inputs, recipe=recipe)
    for name in NAMES:
        assert got[name].dtype == want[name].dtype, name
        assert torch.equal(got[name], want[name]), f"{name} differs under autocast"


def test_emulator_forward_under_autocast_backward_outside():
    """The usual training step: the forward inside autocast, backward() after it; fp32 inputs
    keep fp32 outputs."""
    inputs = make_packed_inputs((40, 7, 1), 2, 1, 64, torch.float32, seed=1)
    want = emulator_call(inputs)
    q, k, v = (x.detach().clone().requires_grad_() for x in (inputs.q, inputs.k, inputs.v))
    cu, n = inputs.cu_seqlens, inputs.max_seqlen
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, lse = flamia.flash_attn_varlen_func(q, k, v, cu, cu, n, n, causal=True, backend="reference",
                                                 return_lse=True)
    out.backward(inputs.do)
    got = {"O": out.detach(), "LSE": lse.transpose(0, 1), "dQ": q.grad, "dK": k.grad, "dV": v.grad}
    for name in NAMES:
        assert got[name].dtype == want[name].dtype, name
        assert torch.equal(got[name], want[name]), f"{name} differs under autocast"
