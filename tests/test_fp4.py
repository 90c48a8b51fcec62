"""The 4-bit recipes in the emulator (NUMERICS.md 6) and Mitchell-P (NUMERICS.md 7): accuracy
against exact attention (paper Table 4), causal safety of the P group scales and the per-key
diagonal operands, the forward/backward P mismatch of the ablations, and the code match of
the bit-level exponential."""
import math

import pytest
import torch

from flamia.accuracy import COMPARED, PAPER_TABLE4, measure
from flamia.formats.bitexp import mitchell_code_match, mitchell_exp2
from flamia.recipes import Recipe
from flamia.reference.emulated import emulate_backward, emulate_forward, emulated_attention, rebuild_p_trace
from flamia.reference.exact import exact_attention
from flamia.workload import exact_reference, make_packed_inputs, training_call


def _batch(lengths, hq=4, hkv=2, d=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    q, k, v, do = (torch.randn(total, h, d, generator=g).bfloat16() for h in (hq, hkv, hkv, hq))
    return q, k, v, do, cu, max(lengths)


def _cos(a, b):
    return torch.nn.functional.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0).item()


def _grads(attn, q, k, v, do):
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out = attn(q, k, v)
    return (out, *torch.autograd.grad(out, (q, k, v), do.to(out.dtype)))


MASKS = {"causal": (True, (-1, -1)), "full": (False, (-1, -1)), "window": (False, (40, 8))}
# Lower bounds of the cosine to exact attention on these small cases (measured with d=64:
# nvfp4 O 0.981-0.994, gradients 0.972-0.990; fp4 O 0.975-0.980, gradients 0.943-0.977).
FLOORS = {"nvfp4": (0.975, 0.965), "fp4": (0.965, 0.93)}


@pytest.mark.parametrize("mask", MASKS)
def test_fwd_bwd_on_packed_odd_lengths_with_gqa(mask):
    """Documents of 63, 111, 1 and 0 tokens, 4 query heads on 2 KV heads: every recipe runs
    forward and backward, stays finite, and orders by precision against exact attention."""
    causal, window = MASKS[mask]
    q, k, v, do, cu, n = _batch([63, 111, 1, 0])
    ref = _grads(lambda *a: exact_attention(*a, cu, cu, n, n, causal, window_size=window)[0], q, k, v, do)
    cos = {}
    for recipe in ("mxfp8", "nvfp4", "fp4"):
        got = _grads(lambda *a: emulated_attention(*a, cu, cu, n, n, causal, window_size=window, recipe=recipe),
                     q, k, v, do)
        assert all(bool(torch.isfinite(t).all()) for t in got)
        cos[recipe] = [_cos(a, b) for a, b in zip(got, ref)]
        print(f"{mask:>7} {recipe:>6} cos O/dQ/dK/dV " + " ".join(f"{c:.4f}" for c in cos[recipe]))
    for recipe, (floor_o, floor_grad) in FLOORS.items():
        assert cos[recipe][0] >= floor_o and min(cos[recipe][1:]) >= floor_grad
    for i in range(4):
        assert cos["mxfp8"][i] > cos["nvfp4"][i] > cos["fp4"][i]


@pytest.mark.slow
def test_table4_accuracy_on_three_documents():
    """Paper Table 4 (causal, 4 x 4096 tokens on a B200) against our emulator on documents
    of 1000, 333 and 1 tokens, 16 heads, d=128, Gaussian inputs: O and dQ cosines within
    0.01 of the paper's."""
    inputs = make_packed_inputs((1000, 333, 1), 16, 16, 128)
    reference = training_call(exact_reference(), inputs, causal=True)
    for i, recipe in enumerate(("nvfp4", "fp4")):
        rep = measure(recipe, inputs, causal=True, reference=reference)
        print(("\n" if i == 0 else "") + rep.format(header=i == 0))
        paper_o, paper_dq = PAPER_TABLE4[recipe]
        assert abs(rep.cos["O"] - paper_o) <= 0.01 and abs(rep.cos["dQ"] - paper_dq) <= 0.01
        assert set(rep.cos) == set(COMPARED)


# -- causal safety -------------------------------------------------------------------------
CUT = 45  # off a block boundary: its 32-key P group and token block are [32, 64)
BLOCK_START = 32


def _run(recipe, q, k, v, do, cu, n):
    fwd = emulate_forward(q, k, v, cu, cu, n, n, causal=True, recipe=recipe)
    dq, _, _ = emulate_backward(fwd, do)
    return {"O": fwd.out.float(), "LSE": fwd.lse.transpose(0, 1), "dQ": dq}


def _perturbed(recipe, name):
    """(before, after) of one call where token CUT of document 0 has its K or V (every head)
    multiplied by 64: its scores (or values) dominate its P group (or token block)."""
    q, k, v, do, cu, n = _batch([200, 77], hq=2, hkv=2, seed=5)
    k2, v2 = k.clone(), v.clone()
    {"k": k2, "v": v2}[name][CUT] *= 64.0
    before, after = _run(recipe, q, k, v, do, cu, n), _run(recipe, q, k2, v2, do, cu, n)
    assert not all(_unchanged(before, after, slice(CUT, 200)).values())  # the token does matter
    return before, after


def _unchanged(before, after, rows):
    return {key: bool(torch.equal(before[key][rows], after[key][rows])) for key in before}


@pytest.mark.parametrize("name", ["k", "v"])
def test_nvfp4_earlier_positions_do_not_see_a_later_token(name):
    """NVFP4 scores are per token and 4-bit P groups take maxima over visible keys only, so a
    later K leaves every earlier O, LSE and dQ bitwise unchanged except dQ inside the token's
    E4M3 block (the documented residue); a later V, through V's token block, may change
    positions inside its block only."""
    before, after = _perturbed("nvfp4", name)
    other_doc = slice(200, 277)
    assert all(_unchanged(before, after, other_doc).values())
    assert all(_unchanged(before, after, slice(0, BLOCK_START)).values())
    if name == "k":
        same = _unchanged(before, after, slice(0, CUT))
        assert same["O"] and same["LSE"]


def test_p_group_scales_before_the_mask_leak():
    """The leaking configuration: group maxima over masked keys too, 4-bit P on diagonal
    tiles. A later K then changes earlier outputs that share its 32-key P group."""
    before, after = _perturbed(Recipe("nvfp4", p4_scale_before_mask=True), "k")
    assert all(_unchanged(before, after, slice(0, BLOCK_START)).values())  # other groups: no
    assert not _unchanged(before, after, slice(BLOCK_START, CUT))["O"]     # the leak is seen


@pytest.mark.parametrize("name", ["k", "v"])
def test_fp4_is_exactly_causal(name):
    """All-4-bit: operand scales are per token (NVFP4) or, for V in P.V and K in dQ, per key
    on diagonal tiles and per 16 fully visible keys elsewhere; P groups skip masked keys. No
    earlier O, LSE or dQ changes at all, not even inside the token's block."""
    before, after = _perturbed("fp4", name)
    assert all(_unchanged(before, after, slice(0, CUT)).values())
    assert all(_unchanged(before, after, slice(200, 277)).values())


# -- what P looks like, and whether the backward rebuilds it --------------------------------
def _group_distinct(p):
    """Distinct values per (row, 32-key group), [B, H, Lq, N/32] (0 counts as one)."""
    s = p.unflatten(-1, (-1, 32)).sort(-1).values
    return (s[..., 1:] != s[..., :-1]).sum(-1) + 1


@pytest.mark.parametrize("recipe, diagonal_is_4bit", [
    ("nvfp4", False), ("fp4", True), (Recipe("nvfp4", p4_scale_before_mask=True), True)])
def test_4bit_p_off_the_diagonal_and_e4m3_on_it(recipe, diagonal_is_4bit):
    """In the forward of one causal 300-token document, every (row, 32-key) group of a
    4-bit P tile takes at most 8 values (E2M1 magnitudes times one scale, V fold included);
    nvfp4's diagonal tiles are E4M3, with many more."""
    q, k, v, _, cu, n = _batch([300], hq=2, hkv=2, seed=1)
    fwd = emulate_forward(q, k, v, cu, cu, n, n, causal=True, recipe=recipe, record_p=True)
    rows = torch.arange(fwd.layout.lq)
    for k0, p, _ in fwd.p_trace:
        distinct = _group_distinct(p)
        diagonal = (rows >= k0) & (rows < k0 + 128)  # fwd tiles of 128 x 128: the block diagonal
        assert int(distinct[:, :, ~diagonal].max()) <= 8
        if bool(diagonal.any()) and k0 < n:
            assert (int(distinct[:, :, diagonal].max()) <= 8) == diagonal_is_4bit


def _p_mismatch(recipe):
    """Fraction of P entries (rows with a finite max) where the backward's rebuilt P differs
    from the forward's, after the forward's exact power-of-two rescale to the final max."""
    q, k, v, _, cu, n = _batch([300, 140], hq=2, hkv=2, seed=2)
    fwd = emulate_forward(q, k, v, cu, cu, n, n, causal=True, recipe=recipe, record_p=True)
    m_final = fwd.layout.rows_q(fwd.m.transpose(0, 1), fill=float("inf"))
    compared = differ = 0
    for (k0, p_fwd, m_tile), (k0b, p_bwd) in zip(fwd.p_trace, rebuild_p_trace(fwd)):
        assert k0 == k0b
        live = torch.isfinite(m_final) & torch.isfinite(m_tile)
        shift = torch.exp2(torch.where(live, m_tile - m_final, torch.zeros_like(m_tile)))
        compared += int(live.sum()) * p_bwd.shape[-1]
        differ += int(((p_fwd * shift[..., None] != p_bwd) & live[..., None]).sum())
    return differ / compared


def test_ablations_make_the_backward_rebuild_a_different_p():
    """fwd_p4_bwd_p8 (4-bit forward P, E4M3 backward P) and fwd_diag_block_m=256 (the forward
    keeps E4M3 on 256-row diagonal tiles, the backward assumes 128) break the forward/backward
    consistency that the default recipes keep."""
    fractions = {label: _p_mismatch(recipe) for label, recipe in [
        ("nvfp4", "nvfp4"), ("fp4", "fp4"), ("fwd_p4_bwd_p8", Recipe("nvfp4", fwd_p4_bwd_p8=True)),
        ("fwd_diag_block_m=256", Recipe("nvfp4", fwd_diag_block_m=256))]}
    print("\nP mismatch forward vs backward: " + ", ".join(f"{k} {v:.2e}" for k, v in fractions.items()))
    assert fractions["nvfp4"] < 1e-3 and fractions["fp4"] < 1e-3
    assert fractions["fwd_p4_bwd_p8"] > 0.05 and fractions["fwd_diag_block_m=256"] > 0.01


# -- Mitchell-P -----------------------------------------------------------------------------
def _gaussian_scores(q_scale, rows=64, keys=4096, d=128, seed=0):
    """Scores in log2 units of Gaussian q (times q_scale) and k, softmax scale 1/sqrt(d)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, d, generator=g) * q_scale
    k = torch.randn(keys, d, generator=g)
    return (q @ k.T) * (math.log2(math.e) / math.sqrt(d))


def test_mitchell_exponential_is_centred_within_3_percent():
    x = torch.linspace(-40.0, 3.99, 400_001)
    ratio = mitchell_exp2(x).double() / torch.exp2(x.double())
    lo, hi = float(ratio.min()) - 1, float(ratio.max()) - 1
    print(f"\nMitchell-P 2^x error: {lo:+.4f} .. {hi:+.4f}")
    assert -0.031 < lo < -0.029 and 0.029 < hi < 0.031  # both ends equally far from 1
    # The integer clamp: any score range stays valid (tiny and positive), never wraps.
    far = mitchell_exp2(torch.tensor([-124.0, -200.0, -1e6, float("-inf")]))
    assert bool((far > 0).all()) and float(far.max()) < 2.0 ** -120
    with pytest.raises(ValueError, match="x: Mitchell-P"):
        mitchell_exp2(torch.tensor([4.0]))


def test_mitchell_p_matches_exact_rounding_on_realistic_score_ranges():
    """Gaussian q and k scaled to within-row score ranges of about 9 to 45 nats (paper: up to
    39.6 on Gaussian inputs) and a trained-model-like 1000-nat range (the clamp's case)."""
    cases = {}
    for q_scale in (1.0, 3.0, 5.0):
        x = _gaussian_scores(q_scale)
        cases[f"{float((x.amax(-1) - x.amin(-1)).max()) / math.log2(math.e):.0f} nats"] = x
    cases["1000+ nats"] = torch.randn(64, 4096, generator=torch.Generator().manual_seed(1)) * 300.0
    every = {name: mitchell_code_match(x) for name, x in cases.items()}
    nonzero = {name: mitchell_code_match(x, nonzero_only=True) for name, x in cases.items()}
    print("\nMitchell-P codes equal to exact rounding (paper 98.7 %), all / nonzero entries: "
          + ", ".join(f"{k} {every[k]:.2%} / {nonzero[k]:.2%}" for k in cases))
    assert min(every.values()) >= 0.95
    assert min(nonzero.values()) >= 0.9  # the codes that carry probability mass match too


def test_p4_sum_quantized_makes_the_used_weights_sum_to_one():
    """With V = 1 every output channel is the sum of the weights O used. fp4 (4-bit P on
    every tile) with l from the unquantized p (``p_sum_codes=False``) has rows short of 1
    (flushed small probabilities); with ``p4_sum_quantized`` they sum to 1 (to bf16)."""
    inputs = make_packed_inputs((300, 77, 1), heads_q=2, head_dim=64, seed=1)
    ones = torch.ones_like(inputs.v)
    args = (inputs.q, inputs.k, ones, inputs.cu_seqlens, inputs.cu_seqlens, inputs.max_seqlen, inputs.max_seqlen)
    from_p = emulated_attention(*args, causal=True, recipe=Recipe("fp4", p_sum_codes=False)).float()
    summed = emulated_attention(*args, causal=True, recipe=Recipe("fp4", p4_sum_quantized=True)).float()
    assert (from_p - 1).abs().max() > 0.05
    assert torch.equal(summed, torch.ones_like(summed))
    with pytest.raises(ValueError, match="^recipe: p4_sum_quantized"):
        Recipe("mxfp8", p4_sum_quantized=True)


def test_p4_sum_quantized_row_whose_weights_all_flush_stays_finite():
    """The leaking ablation scales 4-bit P by groups that include keys a row does not see:
    when a future key's score dwarfs the visible ones, every weight of query 0 flushes to
    zero and the quantized row sum is 0. O is then 0 there (not 0 / 0), and the backward
    stays finite; this NaN ended the first leak run with p4_sum_quantized at step 34."""
    inputs = make_packed_inputs((64,), heads_q=1, head_dim=64, seed=2)
    k = inputs.k.clone()
    k[1:32] = inputs.q[0:1] * 40  # keys 1-31 (query 0's group, in its future) dominate its scores
    args = (inputs.q, k, inputs.v, inputs.cu_seqlens, inputs.cu_seqlens, inputs.max_seqlen, inputs.max_seqlen)
    leak = Recipe("nvfp4", p4_scale_before_mask=True, p4_sum_quantized=True)
    fwd = emulate_forward(*args, causal=True, recipe=leak)
    assert torch.isfinite(fwd.out).all() and torch.equal(fwd.out[0].float(), torch.zeros_like(fwd.out[0].float()))
    grads = emulate_backward(fwd, inputs.do)
    assert all(torch.isfinite(g).all() for g in grads)
