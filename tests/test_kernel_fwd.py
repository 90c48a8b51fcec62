"""The Triton forward (flamia/kernels/attn_fwd.py) of the mxfp8, bf16 and nvfp4 recipes against the emulator
(flamia/reference/emulated.py), fed the emulator's own quantized operands and PV so that only
the forward is under test. Without CUDA the kernel runs on Triton's CPU interpreter, with
small tiles (the emulator gets the same tiles): the integer row max m bit for bit, lse and ro
within fp32 summation-order noise, O within one bf16 rounding of it (bf16 recipe: and rare P
rounding flips, ``P_FLIP_FRACTION``). On the GPU, exp2 is
approximate and the FP8 MMAs may accumulate with reduced precision, so looser bounds apply
(``assert_near``)."""
import math
from dataclasses import replace

import pytest
import torch
import triton
import triton.language as tl

from flamia.kernels.attn_fwd import attention_forward
from flamia.kernels.bwd_math import forward_diagonal
from flamia.kernels.fwd_math import diagonal_tile
from flamia.kernels.configs import ROUTES, AttnTiles, p4_mode, row_sum_mode, tiles_for
from flamia.kernels.layout import aligned_starts, transposed_extent, transposed_reference
from flamia.reference.emulated import emulate_forward

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FP8 = torch.float8_e4m3fn
U = 2.0**-24  # fp32 unit roundoff
# fp32 summation-order noise (l sums p in another order), measured over these cases and three
# seeds: ro within 4.5 U relative; lse within 2.2 U * (1 + |lse|) (absolute: m + log2(l)
# cancels); O bitwise equal but for one element in 24 runs. The bounds leave about 3.5x.
RO_RTOL = 16 * U
LSE_TOL = 8 * U
# O is bf16: fp32 noise flips a rounding, by one ulp (at most 2^-7 relative), only where
# acc * ro lies next to a bf16 tie.
O_FLIP_FRACTION = 0.01
# The bf16 recipe rounds P to bf16. The interpreter's exp2 is numpy's and the emulator's is
# torch's, and they differ by an fp32 ulp on some inputs (22% of them with numpy's AVX-512
# path), so a P next to a bf16 tie can round the other way: about 2^-16 of the P values. One
# such P moves O by at most one bf16 ulp of P (2^-7 P <= 2^-7) times |v| / l; these elements
# must stay that rare and within that.
P_FLIP_FRACTION = 1e-3
# The GPU's lse and ro against the emulator's: fp32 noise and exp2's ~2^-22 sit far below these.
# With l from the P codes (``Recipe.sums_codes``) a P that the approximate exp2 and the
# emulator's round to neighbouring E4M3 codes moves l by one code's ulp, at most 2^-3 of the
# code and so of l: lse by up to ln(8/7) and ro by up to 1/7 on such rows, which must stay rare.
LSE_ABS_TOL = 1e-2
RO_REL_TOL = 1e-2
CODE_FLIP = 2.0 ** -3
FLIP_ROWS = 0.01


# wgmma's K is at least 32 for 8-bit operands; the interpreter takes the cases' 16-key tiles
MMA_MIN_K = 32 if DEVICE == "cuda" else 16


def tiles(bm: int, bn: int) -> AttnTiles:
    """A case's tiles; the key tile (PV's MMA K) at least MMA_MIN_K."""
    return AttnTiles(fwd_block_m=bm, fwd_block_n=max(bn, MMA_MIN_K), fwd_gluon=False, dq_gluon=False,
                     dkdv_gluon=False, bwd_block_m=16, bwd_block_n=16, dq_block_m=16, dq_block_n=16)


def cu_seqlens(lengths) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)


def kernel_inputs(fwd):
    """The kernel's operands from the emulator's: codes in the recipe's formats (float8 E4M3
    or bf16; the mixed NVFP4 route's Q and K bf16), int8 exponents, V^T [Hkv, D, Tk_t] (the
    aligned layout, zeros outside documents) and PV. The all-4-bit route's are bf16 values
    with their scales folded in (exponents 0), and V^T with per-key scales comes last."""
    route = ROUTES[fwd.spec.recipe.name]
    codes, scores = route.codes.torch_dtype, route.scores.torch_dtype
    vt = transposed_reference(fwd.v_op.codes, fwd.spec.cu_seqlens_k, codes)
    exps = [op.exps.to(torch.int8) for op in (fwd.q_op, fwd.k_op, fwd.v_op)]
    if route.all4:
        zero = [torch.zeros_like(e) for e in exps]
        vtd = transposed_reference(fwd.v_op.diagonal, fwd.spec.cu_seqlens_k, codes)
        return (fwd.q_op.dequantize().to(scores), zero[0], fwd.k_op.dequantize().to(scores), zero[1], vt.to(codes),
                zero[2], fwd.pv, vtd.to(codes))
    return (fwd.q_op.codes.to(scores), exps[0], fwd.k_op.codes.to(scores), exps[1], vt.to(codes), exps[2], fwd.pv,
            None)


def launch(fwd):
    """The kernel on the emulator's operands, with the emulator's call description and tiles."""
    sp = fwd.spec
    *operands, vtd = kernel_inputs(fwd)
    return attention_forward(*operands, sp.cu_seqlens_q, sp.cu_seqlens_k, aligned_starts(sp.cu_seqlens_k),
                             causal=sp.causal, window_size=sp.window_size,
                             softmax_scale=sp.softmax_scale, tau=sp.recipe.tau, sigma=sp.recipe.sigma,
                             scale_block=sp.recipe.scale_block, tiles=fwd.tiles, p4=p4_mode(sp.recipe, forward=True),
                             row_sum=row_sum_mode(sp.recipe), diag_block_m=sp.recipe.fwd_diag_block_m,
                             approx_exp=sp.recipe.fwd_approx_exp, v_codes_t_diag=vtd)


def run_both(lens_q, lens_k, heads, d, causal, window, tile_cfg, seed, recipe="mxfp8"):
    """(kernel (out, lse, m, ro), emulator forward) on random normal bf16 inputs."""
    g = torch.Generator().manual_seed(seed)
    hq, hkv = heads
    q = torch.randn(sum(lens_q), hq, d, generator=g).to(DEVICE, torch.bfloat16)
    k = torch.randn(sum(lens_k), hkv, d, generator=g).to(DEVICE, torch.bfloat16)
    v = torch.randn(sum(lens_k), hkv, d, generator=g).to(DEVICE, torch.bfloat16)
    cu_q, cu_k = cu_seqlens(lens_q), cu_seqlens(lens_k)
    max_q, max_k = max(lens_q), max(lens_k)
    fwd = emulate_forward(q, k, v, cu_q, cu_k, max_q, max_k, causal=causal, softmax_scale=d**-0.5,
                          window_size=window, recipe=recipe, tiles=tile_cfg)
    return launch(fwd), fwd


def assert_invalid_rows(got, fwd):
    """Rows that see no key: O = 0, lse = m = +inf, ro = 0, exactly where the emulator has them."""
    out, lse, m, ro = got
    assert out.dtype == torch.bfloat16 and out.shape == fwd.out.shape
    invalid = torch.isinf(fwd.lse)
    assert torch.equal(torch.isinf(lse), invalid) and torch.equal(ro == 0, invalid)
    assert torch.equal(torch.isinf(m), invalid) and torch.equal(m[invalid], fwd.m[invalid])
    assert torch.equal(lse[invalid], fwd.lse[invalid]) and not out.transpose(0, 1)[invalid].any()


def assert_matches(got, fwd):
    """The interpreter against the emulator: only fp32 summation order differs."""
    if DEVICE == "cuda":
        return assert_near(got, fwd)
    out, lse, m, ro = got
    assert_invalid_rows(got, fwd)
    invalid = torch.isinf(fwd.lse)
    assert torch.equal(m, fwd.m), "integer running max differs"
    torch.testing.assert_close(lse[~invalid], fwd.lse[~invalid], rtol=LSE_TOL, atol=LSE_TOL)
    torch.testing.assert_close(ro[~invalid], fwd.ro[~invalid], rtol=RO_RTOL, atol=0)
    want = fwd.out.float()
    diff = (out.float() - want).abs()
    one_ulp = torch.where(want == 0, 0.0, 2.0 ** (torch.floor(torch.log2(want.abs())) - 7))
    beyond = diff > one_ulp
    if fwd.spec.recipe.name == "bf16":
        # 1 / l = ro * 2^(sigma - PV) per row; |v| at most its head's largest code
        group = out.shape[1] // fwd.pv.shape[1]
        inv_l = ro.t() * 2.0 ** (fwd.spec.recipe.sigma - fwd.pv.repeat_interleave(group, dim=1).float())  # [T, Hq]
        v_max = fwd.v_op.codes.float().abs().amax(dim=(0, 2)).repeat_interleave(group)  # [Hq]
        flip = (2.0 ** -7 * v_max[None, :] * inv_l)[..., None]  # [T, Hq, 1]
        assert (diff[beyond] <= (one_ulp + flip.expand_as(diff))[beyond]).all(), "O beyond one P rounding flip"
        assert beyond.float().mean().item() <= P_FLIP_FRACTION
    else:
        assert not beyond.any(), f"O differs by more than one bf16 ulp (max {diff.max().item():.3g})"
    assert (diff > 0).float().mean().item() <= O_FLIP_FRACTION


def assert_rows_near(err: torch.Tensor, tol: float, flip: float, sums_codes: bool, what: str) -> float:
    """err: one error per row that sees a key. Every row within tol, or with l from the codes
    (sums_codes) within tol + flip (one P code flip) on at most FLIP_ROWS of the rows. Returns
    the largest error."""
    if err.numel() == 0:
        return 0.0
    worst, beyond = err.max().item(), (err > tol).float().mean().item()
    if sums_codes:
        assert worst <= tol + flip, f"{what}: error {worst:.3g} beyond one P code flip ({tol} + {flip:.3g})"
        assert beyond <= FLIP_ROWS, f"{what}: {beyond:.3g} of the rows beyond {tol}"
    else:
        assert worst <= tol, f"{what}: error {worst:.3g} > {tol}"
    return worst


def assert_lse_near(lse: torch.Tensor, want: torch.Tensor, sums_codes: bool) -> float:
    """The GPU's lse [Hq, Tq] against the emulator's, absolute, on the rows that see a key
    (``assert_rows_near``)."""
    err = (lse - want)[torch.isfinite(want)].abs()
    return assert_rows_near(err, LSE_ABS_TOL, -math.log1p(-CODE_FLIP), sums_codes, "lse")


def assert_near(got, fwd):
    """The GPU against the emulator. A slightly different S can move a row max across an
    integer (m then differs, and l and ro by a power of two, not lse or O): m must agree on
    almost every row, ro on the rows where m agrees, lse and O everywhere. The bounds sit a
    decade above the expected effects (approximate exp2 ~2^-22, reduced-precision FP8
    accumulation ~2^-13 in S and O), and with l from the P codes allow the rare rows where one
    P rounds to a neighbouring code (``assert_rows_near``); a masking or indexing error moves
    these errors to order one. The printed errors calibrate them."""
    out, lse, m, ro = got
    assert_invalid_rows(got, fwd)
    same_m = m == fwd.m
    m_mismatch = 1.0 - same_m.float().mean().item()
    err_o = ((out.float() - fwd.out.float()).norm() / fwd.out.float().norm()).item()
    print(f"fwd vs emulator: m mismatch {m_mismatch:.3g}, O rel {err_o:.3g}")
    assert m_mismatch <= 1e-2 and err_o <= 2e-2
    sums_codes = fwd.spec.recipe.sums_codes
    err_ro = ((ro - fwd.ro).abs() / fwd.ro)[same_m & (fwd.ro > 0)]
    print(f"ro rel {assert_rows_near(err_ro, RO_REL_TOL, CODE_FLIP / (1 - CODE_FLIP), sums_codes, 'ro'):.3g}, "
          f"lse abs {assert_lse_near(lse, fwd.lse, sums_codes):.3g}")


# (lens_q, lens_k, (Hq, Hkv), D, causal, window, (BM, BN))
CASES = {
    "causal-gqa-d64": ((63, 111, 1, 0), None, (4, 2), 64, True, (-1, -1), (32, 32)),
    "full-gqa-d64": ((63, 111, 1, 0), None, (4, 2), 64, False, (-1, -1), (32, 16)),
    "causal-d128": ((63, 111, 1, 0), None, (2, 2), 128, True, (-1, -1), (32, 16)),
    "full-d128-bm16": ((111, 0, 1, 63), None, (2, 1), 128, False, (-1, -1), (16, 32)),
    "causal-window": ((111, 63, 1), None, (2, 1), 64, True, (40, -1), (16, 16)),
    "two-sided-window": ((111, 63, 0, 1), None, (2, 1), 64, False, (20, 9), (16, 16)),
    # Lq != Lk: bottom-right alignment leaves rows that see no key (and a document with no keys)
    "causal-lq-ne-lk": ((63, 20, 1, 0, 5), (40, 111, 0, 7, 0), (4, 2), 64, True, (-1, -1), (32, 16)),
    "window-lq-ne-lk": ((63, 20, 9), (40, 111, 0), (2, 1), 64, False, (7, 3), (16, 32)),
}


@pytest.mark.parametrize("recipe", ["mxfp8", "bf16"])
@pytest.mark.parametrize("name", list(CASES))
def test_forward_matches_emulator(name, recipe):
    """bf16: the same kernel on bf16 operands with every exponent 0 (P rounded to bf16)."""
    lens_q, lens_k, heads, d, causal, window, (bm, bn) = CASES[name]
    got, fwd = run_both(lens_q, lens_k or lens_q, heads, d, causal, window, tiles(bm, bn), seed=len(name),
                        recipe=recipe)
    assert_matches(got, fwd)


@pytest.mark.parametrize("name", list(CASES))
def test_forward_matches_emulator_nvfp4(name):
    """The mixed NVFP4 route: bf16 score codes beside E4M3 V, 4-bit P off the diagonal tiles
    (key tiles of at least one 32-key P group)."""
    lens_q, lens_k, heads, d, causal, window, (bm, bn) = CASES[name]
    got, fwd = run_both(lens_q, lens_k or lens_q, heads, d, causal, window, tiles(bm, max(bn, 32)), seed=len(name),
                        recipe="nvfp4")
    assert_matches(got, fwd)


@pytest.mark.parametrize("name", list(CASES))
def test_forward_matches_emulator_fp4(name):
    """The all-4-bit route: bf16 values with their scales folded in, 4-bit P on every tile, V
    with per-key scales on the diagonal tiles; with p4_sum_quantized on the causal cases."""
    from flamia.recipes import Recipe

    lens_q, lens_k, heads, d, causal, window, (bm, bn) = CASES[name]
    recipe = Recipe("fp4", p4_sum_quantized=causal)
    got, fwd = run_both(lens_q, lens_k or lens_q, heads, d, causal, window, tiles(bm, max(bn, 32)), seed=len(name),
                        recipe=recipe)
    assert_matches(got, fwd)


@pytest.mark.parametrize("name", ["causal-gqa-d64", "causal-window", "causal-lq-ne-lk"])
def test_forward_matches_emulator_nvfp4_wider_diagonal(name):
    """The fwd_diag_block_m ablation: the forward decides its diagonal tiles over 128 query rows
    (eight or four of its query tiles) while the tiles stay. Where the narrow rule leaves
    tiles off the diagonal that the wide one puts on it (the first case), P and O change."""
    from flamia.recipes import Recipe

    lens_q, lens_k, heads, d, causal, window, (bm, bn) = CASES[name]
    got, fwd = run_both(lens_q, lens_k or lens_q, heads, d, causal, window, tiles(bm, max(bn, 32)), seed=len(name),
                        recipe=Recipe("nvfp4", fwd_diag_block_m=128))
    assert_matches(got, fwd)
    plain = run_both(lens_q, lens_k or lens_q, heads, d, causal, window, tiles(bm, max(bn, 32)), seed=len(name),
                     recipe="nvfp4")[0]
    assert torch.equal(got[0], plain[0]) == (name != "causal-gqa-d64")


@pytest.mark.parametrize("name", ["causal-gqa-d64", "causal-window", "causal-lq-ne-lk"])
def test_forward_matches_emulator_nvfp4_wider_diagonal_keys(name):
    """Diagonal tiles decided over four key tiles (``fwd_diag_block_n``, as nvfp4's shipped
    64-key tiles take 128-key diagonal tiles): the kernel equals the emulator, and P and O
    differ from the key tile's own rule, except under the 40-key window, where each tile a row
    visits holds the window's edge or the causal one either way."""
    lens_q, lens_k, heads, d, causal, window, (bm, bn) = CASES[name]
    bn = max(bn, 32)
    wide = replace(tiles(bm, bn), fwd_diag_block_n=4 * bn)
    got, fwd = run_both(lens_q, lens_k or lens_q, heads, d, causal, window, wide, seed=len(name), recipe="nvfp4")
    assert_matches(got, fwd)
    plain = run_both(lens_q, lens_k or lens_q, heads, d, causal, window, tiles(bm, bn), seed=len(name),
                     recipe="nvfp4")[0]
    assert torch.equal(got[0], plain[0]) == (name == "causal-window")


@pytest.mark.parametrize("changes", [dict(p4_scale_before_mask=True), dict(p4_sum_quantized=True),
                                     dict(p4_scale_before_mask=True, p4_sum_quantized=True)],
                         ids=["leaking", "sum-quantized", "leaking-sum-quantized"])
@pytest.mark.parametrize("name", ["causal-gqa-d64", "causal-window", "causal-lq-ne-lk", "two-sided-window"])
def test_forward_matches_emulator_nvfp4_options(name, changes):
    """The mixed route's 4-bit P options: on every tile with group maxima over the masked keys
    too (p4_scale_before_mask, the leaking ablation), and l summing the 4-bit values
    (p4_sum_quantized)."""
    from flamia.recipes import Recipe

    lens_q, lens_k, heads, d, causal, window, (bm, bn) = CASES[name]
    got, fwd = run_both(lens_q, lens_k or lens_q, heads, d, causal, window, tiles(bm, max(bn, 32)), seed=len(name),
                        recipe=Recipe("nvfp4", **changes))
    assert_matches(got, fwd)


@pytest.mark.parametrize("recipe", ["mxfp8", "nvfp4", "fp4"])
@pytest.mark.parametrize("name", ["causal-gqa-d64", "causal-window", "two-sided-window"])
def test_forward_matches_emulator_l_from_p(name, recipe):
    """p_sum_codes=False: l adds the fp32 p instead of the codes' values (the default's other
    tests cover), on every tile."""
    from flamia.recipes import Recipe

    lens_q, lens_k, heads, d, causal, window, (bm, bn) = CASES[name]
    got, fwd = run_both(lens_q, lens_k or lens_q, heads, d, causal, window, tiles(bm, max(bn, 32)), seed=len(name),
                        recipe=Recipe(recipe, p_sum_codes=False))
    assert_matches(got, fwd)


@pytest.mark.parametrize("recipe", ["mxfp8", "nvfp4"])
@pytest.mark.parametrize("name", ["causal-gqa-d64", "two-sided-window", "causal-lq-ne-lk"])
def test_forward_matches_emulator_approx_exp(name, recipe):
    """The fwd_approx_exp ablation: P from Schraudolph's exponential, bit for bit the
    emulator's (formats.bitexp)."""
    from flamia.recipes import Recipe

    lens_q, lens_k, heads, d, causal, window, (bm, bn) = CASES[name]
    got, fwd = run_both(lens_q, lens_k or lens_q, heads, d, causal, window, tiles(bm, max(bn, 32)), seed=len(name),
                        recipe=Recipe(recipe, fwd_approx_exp=True))
    assert_matches(got, fwd)


@pytest.mark.parametrize("recipe", ["mxfp8", "bf16", "nvfp4"])
def test_forward_default_tiles(recipe):
    """The shipped tiles of each recipe: one query tile per document at these lengths."""
    got, fwd = run_both((111, 1, 0, 63), (111, 1, 0, 63), (2, 1), 128, True, (-1, -1),
                        tiles_for(128, ROUTES[recipe]), seed=3, recipe=recipe)
    assert_matches(got, fwd)


def test_forward_names_bad_argument():
    t, h, d = 5, 2, 64
    i8 = torch.int8
    dev = dict(device=DEVICE)
    args = [torch.zeros((t, h, d), dtype=FP8, **dev), torch.zeros((t, h), dtype=torch.int32, **dev),  # q_exps: not int8
            torch.zeros((t, h, d), dtype=FP8, **dev), torch.zeros((t, h), dtype=i8, **dev),
            torch.zeros((h, d, transposed_extent(t, 1)), dtype=FP8, **dev), torch.zeros((t, h), dtype=i8, **dev),
            torch.zeros((t, h), dtype=torch.int32, **dev),
            cu_seqlens([t]), cu_seqlens([t]), aligned_starts(cu_seqlens([t]))]
    with pytest.raises(ValueError, match="^q_exps: "):
        attention_forward(*args, causal=True, window_size=(-1, -1), softmax_scale=0.125, tau=4, sigma=4,
                          scale_block=32, tiles=AttnTiles())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("recipe", ["mxfp8", "bf16", "nvfp4", "fp4"])
def test_forward_matches_emulator_gpu(recipe):
    """4 documents x 4096 tokens, 16 heads, D=128, causal, the shipped tiles."""
    lens = (4096,) * 4
    route = ROUTES[recipe]
    got, fwd = run_both(lens, lens, (16, 16), 128, True, (-1, -1), tiles_for(128, route), seed=0,
                        recipe=recipe)
    assert_near(got, fwd)


# Longer documents: several key tiles per row, so the Gluon kernel's copy ring wraps.
GLUON_CASES = {**{name: case[:6] for name, case in CASES.items()},
               "long-causal-gqa": ((700, 1, 300, 129), None, (4, 2), 128, True, (-1, -1)),
               "long-two-sided-window": ((700, 300), None, (2, 1), 64, False, (200, 70))}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("recipe", ["mxfp8", "bf16", "nvfp4", "fp4"])
@pytest.mark.parametrize("block_n", [64, 128])
@pytest.mark.parametrize("name", list(GLUON_CASES))
def test_gluon_forward_equals_triton(name, block_n, recipe):
    """The Gluon forward (attn_fwd_gluon.py) and the Triton kernel on the same operands and
    tiles (the shipped ones of the head dim and route, with key tiles of block_n): out, lse,
    m and ro equal bit for bit."""
    case, route = GLUON_CASES[name], ROUTES[recipe]
    assert_gluon_equals_triton(*case, replace(tiles_for(case[3], route), fwd_block_n=block_n),
                               seed=len(name), recipe=recipe)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("recipe, shipped", [("mxfp8-exact", False), ("nvfp4-exact", False), ("nvfp4-exact", True)],
                         ids=["mxfp8-exact", "nvfp4-exact", "nvfp4-exact-shipped-tiles"])
def test_gluon_forward_equals_triton_per_token_exponents(recipe, shipped):
    """The exact recipes' per-token exponents: the Gluon kernel reads a key word per key, on
    128-key tiles and on nvfp4's own (64-key tiles under 128-key diagonal ones)."""
    case = GLUON_CASES["long-causal-gqa"]
    tiles = tiles_for(case[3], ROUTES[recipe.removesuffix("-exact")]) if shipped else AttnTiles()
    assert_gluon_equals_triton(*case, tiles, seed=5, recipe=recipe)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name, changes", [
    ("nvfp4", dict(fwd_diag_block_m=256)), ("nvfp4", dict(p4_scale_before_mask=True, p4_sum_quantized=True)),
    ("nvfp4", dict(p4_sum_quantized=True)), ("mxfp8", dict(fwd_approx_exp=True)), ("nvfp4", dict(fwd_approx_exp=True)),
    ("mxfp8", dict(p_sum_codes=False)), ("nvfp4", dict(p_sum_codes=False))],
    ids=["wider-diagonal", "leaking", "sum-quantized", "approx-exp", "approx-exp-nvfp4", "from-p", "from-p-nvfp4"])
def test_gluon_forward_equals_triton_options(name, changes):
    """The forward's recipe options: nvfp4's diagonal tiles decided over 256 query rows, 4-bit
    P on every tile with group maxima over masked keys (the leaking ablation), l over the
    4-bit values; Schraudolph's exponential; l from p (p_sum_codes=False)."""
    from flamia.recipes import Recipe

    assert_gluon_equals_triton(*GLUON_CASES["long-causal-gqa"], AttnTiles(), seed=6, recipe=Recipe(name, **changes))


def assert_gluon_equals_triton(lens_q, lens_k, heads, d, causal, window, gluon, seed, recipe="mxfp8"):
    got, fwd = run_both(lens_q, lens_k or lens_q, heads, d, causal, window, gluon, seed, recipe)
    fwd.tiles = replace(gluon, fwd_gluon=False)
    want = launch(fwd)
    for what, a, b in zip(("out", "lse", "m", "ro"), got, want):
        assert torch.equal(a, b), f"{what}: {(a != b).sum().item()} of {a.numel()} differ"


@triton.jit
def _diagonal_flags_kernel(p_out, len_q, len_k, wl, wr, n_t, BM: tl.constexpr, BN: tl.constexpr):
    """Program (query tile r, key tile t): diagonal_tile with the forward's window bounds and
    forward_diagonal with the backward's (its tile at query r BM and key t BN)."""
    r, t = tl.program_id(0), tl.program_id(1)
    off = len_k - len_q
    fwd_wl = tl.where(wl < 0, len_k, wl)
    fwd_wr = tl.where(wr < 0, len_q + len_k, wr)
    bwd_wl = tl.where(wl < 0, len_q + len_k, wl)
    bwd_wr = tl.where(wr < 0, len_q + len_k, wr)
    d_fwd = diagonal_tile(t, r * BM, len_q, len_k, off, fwd_wl, fwd_wr, BM, BN)
    d_bwd = forward_diagonal(r * BM + 7 % BM, t * BN + 16 % BN, (len_q, len_k, bwd_wl, bwd_wr), BM, BN)
    tl.store(p_out + (r * n_t + t) * 2, d_fwd.to(tl.int32))
    tl.store(p_out + (r * n_t + t) * 2 + 1, d_bwd.to(tl.int32))


@pytest.mark.parametrize("len_q, len_k, causal, window", [
    (200, 200, True, (-1, -1)), (130, 70, True, (-1, -1)), (70, 130, True, (-1, -1)),
    (200, 200, False, (40, 3)), (150, 90, False, (-1, 20)), (90, 150, True, (33, -1)), (65, 200, False, (-1, -1))])
def test_diagonal_tiles_follow_the_emulators_rule(len_q, len_k, causal, window):
    """Every forward tile that holds a visible pair: diagonal (the mixed route keeps E4M3 P)
    exactly where it also holds a masked pair of a real query and a real key, as the
    emulator's ``KeyTile.diagonal`` decides; the backward's rule from a tile nested inside
    gives the same answer."""
    from flamia.masks import effective_window, visible

    bm, bn = 32, 64
    n_r, n_t = -(-len_q // bm), -(-len_k // bn)
    out = torch.empty((n_r, n_t, 2), dtype=torch.int32, device=DEVICE)
    wl, wr = effective_window(causal, window)
    _diagonal_flags_kernel[(n_r, n_t)](out, len_q, len_k, wl, wr, n_t, BM=bm, BN=bn)
    q, k = torch.arange(n_r * bm)[:, None], torch.arange(n_t * bn)[None, :]
    vis = visible(q, k, torch.tensor(len_q), torch.tensor(len_k), causal, window)
    masked = (q < len_q) & (k < len_k) & ~vis
    tiles = (n_r, bm, n_t, bn)
    has_vis, has_masked = vis.reshape(tiles).any(3).any(1), masked.reshape(tiles).any(3).any(1)
    want = has_vis & has_masked
    got = out.cpu().bool()
    assert has_vis.any()
    assert torch.equal(got[..., 0][has_vis], want[has_vis])
    assert torch.equal(got[..., 1][has_vis], want[has_vis])
