"""The Triton backward (flamia/kernels/attn_bwd.py) of the mxfp8, bf16 and nvfp4 recipes against the emulator's backward
(flamia/reference/emulated.py), fed the emulator's own quantized operands (Q^, K^, V^, dO^,
dOt^ and their transposes, delta, m, ro, PV) so that only the two backward kernels are under
test: dQ, dK and dV within fp32 summation-order noise. Without CUDA the kernels run on
Triton's CPU interpreter, with small tiles (the emulator gets the same tiles). On the GPU,
exp2 is approximate and the FP8 MMAs may accumulate with reduced precision, so the looser
bound of the gpu tests applies (``assert_grads_match``)."""
from dataclasses import replace

import pytest
import torch

from flamia.formats.e4m3 import round_to_e4m3
from flamia.formats.scales import exp2i, scale_exponent
from flamia.kernels.attn_bwd import attention_backward
from flamia.kernels.configs import ROUTES, AttnTiles, grad_mode, p4_mode, tiles_for
from flamia.kernels.layout import aligned_starts, transposed_extent, transposed_reference
from flamia.masks import visible
from flamia.recipes import Recipe, resolve_recipe
from flamia.reference.emulated import emulate_backward, emulate_forward

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FP8 = torch.float8_e4m3fn
U = 2.0**-24  # fp32 unit roundoff
# fp32 summation-order noise: over these cases, the default-tile one and five seeds (35 runs),
# max |kernel - emulator| stayed within 2.7 U * max |emulator| for each of dQ, dK and dV; no
# difference was the size of a flipped E4M3 code of P or G (~2^-4 of a term). 6x margin.
GRAD_TOL = 16 * U
# bf16 codes: S, dP and D are inexact fp32 sums (16-bit products over the head dim), so their
# summation order can flip a bf16 rounding of P or of the payload G, which moves a gradient
# element by one bf16 ulp of one term (2^-8 of it). Measured over these cases and three
# seeds: max |kernel - emulator| / max |emulator| up to 6.8e-4 (dK), 1.9e-4 (dQ), 3.3e-5 (dV,
# whose operand P^ ro is a bf16 rounding too: NUMERICS.md 4a); most runs stay within GRAD_TOL.
# The bound leaves about 6x.
BF16_GRAD_TOL = 2.0**-8
# The mixed NVFP4 route's scores are bf16 products too, but its S sums were exact in every
# case and seed measured (max error 1.6e-7, no 4-bit P flip): GRAD_TOL holds.
TOLERANCE = {"mxfp8": GRAD_TOL, "bf16": BF16_GRAD_TOL, "nvfp4": GRAD_TOL}
# On the GPU a few E4M3 codes of P and G flip: the bound is on each gradient's relative norm, as
# in test_backward_matches_emulator_gpu; a masking or indexing error moves it to order one.
GPU_GRAD_TOL = 1e-2
# wgmma's K is at least 32 for 8-bit operands; the interpreter takes the cases' 16-row steps
MMA_MIN_K = 32 if DEVICE == "cuda" else 16


def tiles(bwd_m: int, bwd_n: int, dq_m: int, dq_n: int, dq_atomic: bool = False) -> AttnTiles:
    """A case's tiles; the query step (dK's and dV's MMA K) and dQ's key step at least MMA_MIN_K."""
    return AttnTiles(fwd_block_m=32, fwd_block_n=32, fwd_gluon=False, dq_gluon=False, dkdv_gluon=False,
                     bwd_block_m=max(bwd_m, MMA_MIN_K), bwd_block_n=bwd_n, dq_block_m=dq_m,
                     dq_block_n=max(dq_n, MMA_MIN_K), dq_atomic=dq_atomic)


def cu_seqlens(lengths) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)


def kernel_inputs(fwd, do) -> tuple[tuple, dict]:
    """attention_backward's arguments from the emulator's operands and its dO quantization."""
    spec, t = fwd.spec, fwd.tiles
    go = fwd.numerics.grad_output(do, fwd.out, fwd.ro, spec.cu_seqlens_q, spec.max_seqlen_q, t.bwd_block_m)
    q, k, v, g_do, g_dot = fwd.q_op, fwd.k_op, fwd.v_op, go.do, go.dot
    cu_q, cu_k = spec.cu_seqlens_q, spec.cu_seqlens_k
    route = ROUTES[spec.recipe.name]
    i8, codes, scores = torch.int8, route.codes.torch_dtype, route.scores.torch_dtype
    # dK and dQ multiply the gradient operands of Q and K (the mixed route's E4M3 token blocks,
    # the scores' exponents), the scores the score operands
    gq, gk = fwd.numerics.grad_operands(*fwd.inputs[:2], q, k, cu_q, cu_k, spec.max_seqlen_q, spec.max_seqlen_k)

    def transposed(x, cu):  # [H, D, T_t] codes in the aligned layout (none where the kernels read rows)
        return None if route.rows else transposed_reference(x, cu, codes).to(codes)

    kwargs = dict(causal=spec.causal, window_size=spec.window_size, softmax_scale=spec.softmax_scale,
                  sigma=spec.recipe.sigma, scale_block=spec.recipe.scale_block, tiles=t,
                  rotate=fwd.numerics.hadamard, p4=p4_mode(spec.recipe, forward=False))
    if route.all4:  # bf16 values with every scale folded in, exponents 0; V in dP in NVFP4
        gv = fwd.numerics.value_grad_operand(fwd.inputs[2], v, cu_k, spec.max_seqlen_k)
        zq, zk = (torch.zeros(x.shape[:2], dtype=i8, device=x.device) for x in (q.codes, k.codes))
        args = (q.dequantize().to(scores), transposed(gq.codes, cu_q), zq, k.dequantize().to(scores),
                transposed(gk.codes, cu_k), zk, gv.dequantize().to(codes), zk, g_do.dequantize().to(codes), zq,
                transposed(g_dot.codes, cu_q), zq, go.delta, fwd.m, fwd.ro, fwd.pv, cu_q, cu_k, aligned_starts(cu_q),
                aligned_starts(cu_k))
        kwargs.update(grad4=grad_mode(spec.recipe), k_codes_t_diag=transposed(gk.diagonal, cu_k), seed=spec.seed)
        return args, kwargs
    assert torch.equal(gq.exps, q.exps) and torch.equal(gk.exps, k.exps)
    dot = transposed(g_dot.codes, cu_q)
    if route.dot_values:  # dOt^ as BF16 values: its codes times their 2^edOt (exact)
        dot = transposed_reference(g_dot.dequantize(), cu_q, torch.bfloat16).to(torch.bfloat16)
    args = (q.codes.to(scores), transposed(gq.codes, cu_q), q.exps.to(i8), k.codes.to(scores),
            transposed(gk.codes, cu_k), k.exps.to(i8), v.codes.to(codes), v.exps.to(i8), g_do.codes.to(codes),
            g_do.exps.to(i8), dot, g_dot.exps.to(i8), go.delta, fwd.m, fwd.ro, fwd.pv, cu_q, cu_k,
            aligned_starts(cu_q), aligned_starts(cu_k))
    return args, kwargs


def run_both(lens_q, lens_k, heads, d, causal, window, tile_cfg, seed, recipe="mxfp8", rng_seed=0):
    """(kernel (dq, dk, dv), emulator (dq, dk, dv)) on random normal bf16 inputs; rng_seed: the
    call's seed of a stochastic G."""
    g = torch.Generator().manual_seed(seed)
    hq, hkv = heads
    q = torch.randn(sum(lens_q), hq, d, generator=g).to(DEVICE, torch.bfloat16)
    k = torch.randn(sum(lens_k), hkv, d, generator=g).to(DEVICE, torch.bfloat16)
    v = torch.randn(sum(lens_k), hkv, d, generator=g).to(DEVICE, torch.bfloat16)
    do = torch.randn(sum(lens_q), hq, d, generator=g).to(DEVICE, torch.bfloat16)
    fwd = emulate_forward(q, k, v, cu_seqlens(lens_q), cu_seqlens(lens_k), max(lens_q), max(lens_k), causal=causal,
                          softmax_scale=d**-0.5, window_size=window, recipe=recipe, tiles=tile_cfg, seed=rng_seed)
    args, kwargs = kernel_inputs(fwd, do)
    return attention_backward(*args, **kwargs), emulate_backward(fwd, do)


def relative_errors(got, want) -> list[float]:
    """max |got - want| / max |want| for each of dq, dk, dv."""
    return [((a - b).abs().max() / b.abs().max()).item() for a, b in zip(got, want)]


def assert_grads_match(got, want, bound: float = GRAD_TOL):
    """The interpreter: each of dq, dk, dv within ``bound`` of the emulator's (relative_errors).
    The GPU: each within GPU_GRAD_TOL in relative norm."""
    if DEVICE == "cuda":
        errs = [((a - b).norm() / b.norm()).item() for a, b in zip(got, want)]
        assert max(errs) <= GPU_GRAD_TOL, f"dq, dk, dv relative norm errors {errs} (bound {GPU_GRAD_TOL:.3g})"
        return
    errs = relative_errors(got, want)
    assert max(errs) <= bound, f"dq, dk, dv relative errors {errs} (bound {bound:.3g})"


def assert_unseen_rows_zero(got, want, lens_q, lens_k, causal, window):
    """The gradient rows of queries that see no key (dQ) and of keys that no query sees (dK,
    dV) are exactly zero in the kernels' and the emulator's (dq, dk, dv). Rows that sum to
    zero by cancellation (a one-token document: O = V, so dP = D) are left to the error bound:
    dP and D are fp32 sums of the same products in different orders (an MMA's, a row sum's),
    exact only where the products' exponents are close."""
    q_unseen, k_unseen = [], []
    for lq, lk in zip(lens_q, lens_k):
        seen = visible(torch.arange(lq)[:, None], torch.arange(lk)[None, :], torch.tensor(lq), torch.tensor(lk),
                       causal, window)  # [lq, lk]
        q_unseen.append(~seen.any(1))
        k_unseen.append(~seen.any(0))
    q_rows, k_rows = torch.cat(q_unseen), torch.cat(k_unseen)
    for name, a, b, r in zip(("dq", "dk", "dv"), got, want, (q_rows, k_rows, k_rows)):
        r = r.to(a.device)
        assert not b[r].any() and not a[r].any(), f"{name}: rows that see nothing are not zero"


# (lens_q, lens_k or None (= lens_q), (Hq, Hkv), D, causal, window,
#  (bwd_block_m, bwd_block_n, dq_block_m, dq_block_n))
CASES = {
    "causal-gqa-d64": ((63, 111, 1, 0, 40), None, (4, 2), 64, True, (-1, -1), (32, 64, 32, 16)),
    "full-d128": ((63, 111, 1, 0, 40), None, (2, 1), 128, False, (-1, -1), (32, 64, 64, 32)),
    # window edges inside the tiles: masked steps on both sides of the unmasked ones
    "causal-window": ((111, 63, 1), None, (2, 1), 64, True, (60, -1), (16, 32, 16, 16)),
    "two-sided-window-gqa": ((111, 0, 1, 40), None, (2, 1), 64, False, (40, 20), (16, 32, 32, 16)),
    # Lq != Lk: bottom-right alignment leaves rows that see no key, a document without keys
    # (its dQ is zero) and one without queries (its dK, dV are zero)
    "causal-lq-ne-lk": ((63, 20, 1, 0, 5), (40, 111, 0, 7, 0), (4, 2), 64, True, (-1, -1), (16, 32, 32, 16)),
    "window-lq-ne-lk": ((63, 20, 9), (40, 111, 0), (2, 1), 64, False, (7, 3), (16, 32, 32, 16)),
}


@pytest.mark.parametrize("recipe", ["mxfp8", "bf16"])
@pytest.mark.parametrize("name", list(CASES))
def test_backward_matches_emulator(name, recipe):
    lens_q, lens_k, heads, d, causal, window, tile_sizes = CASES[name]
    got, want = run_both(lens_q, lens_k or lens_q, heads, d, causal, window, tiles(*tile_sizes), seed=len(name),
                         recipe=recipe)
    for a, b in zip(got, want):
        assert a.shape == b.shape and a.dtype == torch.float32 and b.abs().max() > 0
    assert_unseen_rows_zero(got, want, lens_q, lens_k or lens_q, causal, window)
    assert_grads_match(got, want, TOLERANCE[recipe])


def nvfp4_tiles(bwd_m: int, bwd_n: int, dq_m: int, dq_n: int) -> AttnTiles:
    """A case's tiles for the mixed NVFP4 route: key steps of whole 32-key P groups, nested in
    64 x 64 forward tiles (the backward rebuilds the forward's diagonal tiles)."""
    return AttnTiles(fwd_block_m=64, fwd_block_n=64, fwd_gluon=False, dq_gluon=False, dkdv_gluon=False,
                     bwd_block_m=max(bwd_m, MMA_MIN_K), bwd_block_n=max(bwd_n, 32), dq_block_m=dq_m,
                     dq_block_n=max(dq_n, 32))


# G rounded to nearest is one constexpr branch of the same rounding helper: two cases cover it
FP4_CASES = [(name, "stochastic") for name in CASES] + [("causal-gqa-d64", "nearest"), ("full-d128", "nearest")]


@pytest.mark.parametrize("name, rounding", FP4_CASES)
def test_backward_matches_emulator_fp4(name, rounding):
    """The all-4-bit route: bf16 values with their scales folded in, 4-bit P on every tile, K
    with per-key scales on the diagonal dQ tiles, G rounded to E2M1 in groups of 16
    (stochastically from the call's seed, or to nearest); at d=128 with the Hadamard rotation."""
    lens_q, lens_k, heads, d, causal, window, tile_sizes = CASES[name]
    recipe = Recipe("fp4", stochastic_grad=rounding == "stochastic", hadamard=d == 128)
    got, want = run_both(lens_q, lens_k or lens_q, heads, d, causal, window, nvfp4_tiles(*tile_sizes),
                         seed=len(name), recipe=recipe, rng_seed=2**40 + len(name))
    for a, b in zip(got, want):
        assert a.shape == b.shape and b.abs().max() > 0
    assert_unseen_rows_zero(got, want, lens_q, lens_k or lens_q, causal, window)
    # BF16 operands with no E4M3 code to flip: the interpreter's bound holds on the GPU too
    errs = relative_errors(got, want)
    assert max(errs) <= GRAD_TOL, f"dq, dk, dv relative errors {errs} (bound {GRAD_TOL:.3g})"


@pytest.mark.parametrize("name", list(CASES))
def test_backward_matches_emulator_nvfp4(name):
    """The mixed NVFP4 route: bf16 score codes, E4M3 gradient operands, the forward's 4-bit P
    rebuilt off its diagonal tiles."""
    lens_q, lens_k, heads, d, causal, window, tile_sizes = CASES[name]
    got, want = run_both(lens_q, lens_k or lens_q, heads, d, causal, window, nvfp4_tiles(*tile_sizes),
                         seed=len(name), recipe="nvfp4")
    for a, b in zip(got, want):
        assert a.shape == b.shape and b.abs().max() > 0
    assert_unseen_rows_zero(got, want, lens_q, lens_k or lens_q, causal, window)
    assert_grads_match(got, want)


@pytest.mark.parametrize("name", ["causal-gqa-d64", "causal-lq-ne-lk"])
def test_backward_matches_emulator_nvfp4_wider_diagonal_keys(name):
    """The forward's diagonal tiles decided over two of its 64-key tiles (``fwd_diag_block_n``,
    as nvfp4's shipped tiles): the backward rebuilds P from that rule, as the emulator does."""
    lens_q, lens_k, heads, d, causal, window, tile_sizes = CASES[name]
    wide = replace(nvfp4_tiles(*tile_sizes), fwd_diag_block_n=128)
    got, want = run_both(lens_q, lens_k or lens_q, heads, d, causal, window, wide, seed=len(name), recipe="nvfp4")
    assert_grads_match(got, want)
    plain = run_both(lens_q, lens_k or lens_q, heads, d, causal, window, nvfp4_tiles(*tile_sizes), seed=len(name),
                     recipe="nvfp4")[1]
    assert max(relative_errors(plain, want)) > 100 * GRAD_TOL  # the rule moves the gradients


@pytest.mark.parametrize("name", ["causal-gqa-d64", "causal-window", "causal-lq-ne-lk", "two-sided-window-gqa"])
def test_backward_matches_emulator_nvfp4_leaking(name):
    """The leaking ablation (p4_scale_before_mask): 4-bit P rebuilt on every tile, its group
    maxima over the in-bounds keys, masked or not."""
    from flamia.recipes import Recipe

    lens_q, lens_k, heads, d, causal, window, tile_sizes = CASES[name]
    got, want = run_both(lens_q, lens_k or lens_q, heads, d, causal, window, nvfp4_tiles(*tile_sizes),
                         seed=len(name), recipe=Recipe("nvfp4", p4_scale_before_mask=True, p4_sum_quantized=True))
    assert_grads_match(got, want)


@pytest.mark.parametrize("name", ["causal-gqa-d64", "causal-lq-ne-lk"])
def test_backward_matches_emulator_after_approx_exp(name):
    """The fwd_approx_exp ablation's backward: the exact exponential on the approximate
    forward's m and ro (the mismatch the ablation studies)."""
    from flamia.recipes import Recipe

    lens_q, lens_k, heads, d, causal, window, tile_sizes = CASES[name]
    got, want = run_both(lens_q, lens_k or lens_q, heads, d, causal, window, tiles(*tile_sizes), seed=len(name),
                         recipe=Recipe("mxfp8", fwd_approx_exp=True))
    assert_grads_match(got, want)


@pytest.mark.parametrize("name", ["causal-gqa-d64", "causal-window", "causal-lq-ne-lk"])
def test_backward_matches_emulator_nvfp4_e4m3_p(name):
    """The fwd_p4_bwd_p8 ablation: the backward rebuilds P in E4M3 on every tile, as the
    MXFP8 route does, whatever the forward used."""
    from flamia.recipes import Recipe

    lens_q, lens_k, heads, d, causal, window, tile_sizes = CASES[name]
    got, want = run_both(lens_q, lens_k or lens_q, heads, d, causal, window, nvfp4_tiles(*tile_sizes),
                         seed=len(name), recipe=Recipe("nvfp4", fwd_p4_bwd_p8=True))
    assert_grads_match(got, want)


@pytest.mark.parametrize("name", ["causal-gqa-d64", "full-d128", "two-sided-window-gqa", "causal-lq-ne-lk"])
def test_backward_dq_atomic_matches_emulator(name):
    """dQ from the dK/dV kernel's tiles through fp32 atomics (AttnTiles.dq_atomic): the same
    payloads as the dQ kernel with a key step of bwd_block_n, so the same bound holds; the
    dQ kernel is not launched, and dK, dV do not change."""
    lens_q, lens_k, heads, d, causal, window, (bwd_m, bwd_n, dq_m, _) = CASES[name]
    t = tiles(bwd_m, bwd_n, dq_m, bwd_n, dq_atomic=True)
    got, want = run_both(lens_q, lens_k or lens_q, heads, d, causal, window, t, seed=len(name))
    assert want[0].abs().max() > 0
    assert_unseen_rows_zero(got, want, lens_q, lens_k or lens_q, causal, window)
    assert_grads_match(got, want)
    plain, _ = run_both(lens_q, lens_k or lens_q, heads, d, causal, window, replace(t, dq_atomic=False),
                        seed=len(name))
    assert torch.equal(got[1], plain[1]) and torch.equal(got[2], plain[2])


def test_dq_atomic_needs_the_key_tile_as_dq_step():
    with pytest.raises(ValueError, match="^dq_atomic: .* dq_block_n \\(128\\) must equal bwd_block_n \\(64\\)"):
        AttnTiles(dq_block_n=128, dq_atomic=True, dkdv_gluon=False)


@pytest.mark.parametrize("cap", [32, 256])
def test_dkdv_register_cap_is_a_register_count(cap):
    with pytest.raises(ValueError, match=f"^dkdv_maxnreg: .* got {cap}$"):
        AttnTiles(dkdv_maxnreg=cap)


def test_backward_default_tiles():
    """The shipped tiles (dK/dV: 64-key tiles, 32-query steps; dQ: 64 x 64) at D=128 with the
    Hadamard rotation."""
    got, want = run_both((111, 1, 0, 63), (111, 1, 0, 63), (2, 1), 128, True, (-1, -1), AttnTiles(), seed=3)
    assert_grads_match(got, want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_backward_output_dtype_rounds_fp32_result(dtype):
    """Gradients stored in bf16/fp16 by the kernels' epilogues equal the fp32 gradients
    rounded to nearest even (torch's cast), bit for bit, rotated back or not."""
    g = torch.Generator().manual_seed(5)
    lens = (70, 1, 33)
    for d in (64, 128):
        q, k, v, do = (torch.randn(sum(lens), 2, d, generator=g).to(DEVICE, torch.bfloat16) for _ in range(4))
        cu = cu_seqlens(lens)
        t = tiles(32, 32, 32, 16)
        fwd = emulate_forward(q, k, v, cu, cu, max(lens), max(lens), causal=True, softmax_scale=d**-0.5,
                              recipe="mxfp8", tiles=t)
        args, kwargs = kernel_inputs(fwd, do)
        kwargs["rotate"] = d == 128
        want = attention_backward(*args, **kwargs)
        got = attention_backward(*args, **kwargs, out_dtype=dtype)
        for a, b in zip(got, want):
            assert a.dtype == dtype and torch.equal(a, b.to(dtype))


def test_backward_names_bad_argument():
    t, h, d = 5, 2, 64
    codes = torch.zeros((t, h, d), dtype=FP8, device=DEVICE)
    codes_t = torch.zeros((h, d, transposed_extent(t, 1)), dtype=FP8, device=DEVICE)
    exps, stats = torch.zeros((t, h), dtype=torch.int8, device=DEVICE), torch.zeros((h, t), device=DEVICE)
    args = [codes, codes_t, exps, codes, codes_t, exps, codes, exps, codes, exps, codes_t,
            exps.int(),  # dot_exps: not int8
            stats, stats, stats, torch.zeros((t, h), dtype=torch.int32, device=DEVICE), *[cu_seqlens([t])] * 2,
            *[aligned_starts(cu_seqlens([t]))] * 2]
    with pytest.raises(ValueError, match="^dot_exps: "):
        attention_backward(*args, causal=True, window_size=(-1, -1), softmax_scale=0.125, sigma=4, scale_block=32,
                           tiles=AttnTiles())
    args[11] = exps
    for i, name in ((1, "q_codes_t"), (4, "k_codes_t"), (10, "dot_codes_t")):
        with pytest.raises(ValueError, match=f"^{name}: None on the bf16 route .* got None with "):
            attention_backward(*args[:i], None, *args[i + 1:], causal=True, window_size=(-1, -1),
                               softmax_scale=0.125, sigma=4, scale_block=32, tiles=AttnTiles())
    bf16 = [x.to(torch.bfloat16) if x.dtype == FP8 else x for x in args]
    with pytest.raises(ValueError, match="^q_codes_t: None on the bf16 route .* got a tensor with "):
        attention_backward(*bf16, causal=True, window_size=(-1, -1), softmax_scale=0.125, sigma=4, scale_block=32,
                           tiles=AttnTiles())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("recipe, tile_cfg", [("mxfp8", AttnTiles()),
                                              ("mxfp8", AttnTiles(dq_atomic=True, dkdv_gluon=False)),
                                              ("bf16", tiles_for(128, ROUTES["bf16"])),
                                              ("nvfp4", tiles_for(128, ROUTES["nvfp4"])),
                                              ("fp4", tiles_for(128, ROUTES["fp4"]))],
                         ids=["shipped", "dq-atomic", "shipped-bf16", "shipped-nvfp4", "shipped-fp4"])
def test_backward_matches_emulator_gpu(recipe, tile_cfg):
    """4 documents x 4096 tokens, 16 heads, D=128, causal: the shipped tiles, and dQ through
    atomics. On the GPU exp2 is approximate and the FP8 MMAs may accumulate with reduced
    precision, which may flip a few E4M3 codes of P and G, so the bound is on the relative
    norm of the difference; a masking or indexing error moves it by orders of magnitude
    more. Also: two runs agree bit for bit (with atomics: dK and dV; dQ to fp32 summation
    order), and a CUDA-graph replay reproduces them (no host synchronisation). fp4 (its E2M1
    G from one seed on both sides) takes test_kernel_ops.py's 4-bit bound, 2e-2."""
    lens = (4096,) * 4
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(sum(lens), 16, 128, generator=g).to(DEVICE, torch.bfloat16) for _ in range(4))
    cu = cu_seqlens(lens)
    fwd = emulate_forward(q, k, v, cu, cu, 4096, 4096, causal=True, softmax_scale=128**-0.5, recipe=recipe,
                          tiles=tile_cfg)
    want = emulate_backward(fwd, do)
    args, kwargs = kernel_inputs(fwd, do)
    raw = attention_backward(*args, **kwargs)
    errs = [((a - b).norm() / b.norm()).item() for a, b in zip(raw, want)]
    print(f"gpu bwd vs emulator, relative norm error: dq {errs[0]:.3g}, dk {errs[1]:.3g}, dv {errs[2]:.3g}")
    assert max(errs) <= (2e-2 if recipe == "fp4" else 1e-2)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = attention_backward(*args, **kwargs)
    graph.replay()
    for again, what in ((attention_backward(*args, **kwargs), "two runs"), (captured, "CUDA-graph replay")):
        assert torch.equal(again[1], raw[1]) and torch.equal(again[2], raw[2]), f"{what}: dK or dV differ"
        dq_err = ((again[0] - raw[0]).norm() / raw[0].norm()).item()
        assert dq_err <= (1e-6 if tile_cfg.dq_atomic else 0.0), f"{what}: dQ differs ({dq_err:.3g})"


# Bitwise checks of the Gluon dQ and dK/dV kernels: their shipped tiles for each head dim on
# the CASES geometries, longer documents for several steps and a wrapping copy ring, rotation
# on (D=128) and off (D=64), per-token exponents.
GLUON_BWD_CASES = {**{name: (*case[:6], "mxfp8") for name, case in CASES.items()},
                  "long-causal-gqa": ((700, 1, 300, 129), None, (4, 2), 128, True, (-1, -1), "mxfp8"),
                  "long-window": ((700, 300), None, (2, 1), 64, False, (200, 70), "mxfp8"),
                  "long-per-token": ((700, 300), None, (2, 2), 128, True, (-1, -1), "mxfp8-exact"),
                  **{f"{name}-bf16": (*case[:6], "bf16") for name, case in CASES.items()},
                  "long-causal-gqa-bf16": ((700, 1, 300, 129), None, (4, 2), 128, True, (-1, -1), "bf16"),
                  "long-window-bf16": ((700, 300), None, (2, 1), 64, False, (200, 70), "bf16"),
                  **{f"{name}-nvfp4": (*case[:6], "nvfp4") for name, case in CASES.items()},
                  "long-causal-gqa-nvfp4": ((700, 1, 300, 129), None, (4, 2), 128, True, (-1, -1), "nvfp4"),
                  "long-window-nvfp4": ((700, 300), None, (2, 1), 64, False, (200, 70), "nvfp4"),
                  "long-per-token-nvfp4": ((700, 300), None, (2, 2), 128, True, (-1, -1), "nvfp4-exact"),
                  "long-causal-gqa-nvfp4-leaking": ((700, 1, 300, 129), None, (4, 2), 128, True, (-1, -1),
                                                    Recipe("nvfp4", p4_scale_before_mask=True)),
                  "long-window-nvfp4-leaking": ((700, 300), None, (2, 1), 64, False, (200, 70),
                                                Recipe("nvfp4", p4_scale_before_mask=True)),
                  **{f"{name}-fp4": (*case[:6], "fp4") for name, case in CASES.items()},
                  "long-causal-gqa-fp4": ((700, 1, 300, 129), None, (4, 2), 128, True, (-1, -1), "fp4"),
                  "long-window-fp4-nearest": ((700, 300), None, (2, 1), 64, False, (200, 70),
                                              Recipe("fp4", stochastic_grad=False))}


def _gluon_case(name, **changes):
    """The backward launcher's arguments on GLUON_BWD_CASES[name] (the emulator's forward), for
    the shipped tiles of its head dim with ``changes``."""
    lens_q, lens_k, (hq, hkv), d, causal, window, recipe = GLUON_BWD_CASES[name]
    tiles = replace(tiles_for(d, ROUTES[resolve_recipe(recipe).name]), **changes)
    lens_k = lens_k or lens_q
    g = torch.Generator().manual_seed(len(name))
    q, do = (torch.randn(sum(lens_q), hq, d, generator=g).to(DEVICE, torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(sum(lens_k), hkv, d, generator=g).to(DEVICE, torch.bfloat16) for _ in range(2))
    fwd = emulate_forward(q, k, v, cu_seqlens(lens_q), cu_seqlens(lens_k), max(lens_q), max(lens_k), causal=causal,
                          softmax_scale=d**-0.5, window_size=window, recipe=recipe, tiles=tiles)
    return kernel_inputs(fwd, do)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", list(GLUON_BWD_CASES))
def test_gluon_dq_equals_triton(name):
    """The Gluon dQ kernel (attn_dq_gluon.py) and the Triton one on the same operands and
    tiles: dQ equal bit for bit."""
    args, kwargs = _gluon_case(name)
    got = attention_backward(*args, **kwargs)[0]
    want = attention_backward(*args, **{**kwargs, "tiles": replace(kwargs["tiles"], dq_gluon=False)})[0]
    assert torch.equal(got, want), f"dQ: {(got != want).sum().item()} of {got.numel()} differ"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("step", [64, 32], ids=["64-query-steps", "32-query-steps"])
@pytest.mark.parametrize("name", list(GLUON_BWD_CASES))
def test_gluon_dkdv_equals_triton(name, step):
    """The Gluon dK/dV kernel (attn_dkdv_gluon.py) and the Triton one on the same operands and
    tiles: dK and dV equal bit for bit, with query steps of 64 (two halves per step) and 32."""
    args, kwargs = _gluon_case(name, bwd_block_m=step)
    tiles = kwargs["tiles"]
    got = attention_backward(*args, **kwargs)[1:]
    want = attention_backward(*args, **{**kwargs, "tiles": replace(tiles, dkdv_gluon=False)})[1:]
    for what, a, b in zip(("dK", "dV"), got, want):
        assert torch.equal(a, b), f"{what}: {(a != b).sum().item()} of {a.numel()} differ"


@pytest.mark.parametrize("sigma", range(9))
def test_v_fold_as_one_multiply_gives_the_contract_codes(sigma):
    """NUMERICS.md 4: the backward kernels fold V into the P codes as p (vf rf) (one value of
    vf rf per query and key block, computed once) where the forward and the contract say
    (p vf) rf; the E4M3 codes are the same over the range the operands take: p in
    [0, 2^tau], tau = 8 - sigma the largest the recipe allows, eV in [EXP_MIN, 127 - tau] =
    [-100, 119 + sigma] and PV in [eV, 127] (the row's prefix max covers every key it sees).
    Where a code is nonzero both orders are exact; elsewhere both round below 2^-10, to zero.
    (Above 127 - tau the contract's p vf can overflow to inf and the backward's order cannot;
    bf16 and fp32 inputs give eV <= 120.)"""
    g = torch.Generator().manual_seed(sigma)
    n = 1 << 18
    tau = 8 - sigma
    p = torch.exp2(-torch.rand(n, generator=g) * 130) * 2.0**tau   # log-uniform in [2^-130, 2^tau]
    p[:64] = 0.0
    p[64:128] = 2.0**tau
    e_v = torch.randint(-100, 128 - tau, (n,), generator=g)
    # PV - eV: near 0 for half the draws (nonzero codes), anywhere up to 127 - eV for the rest
    gap = torch.where(torch.rand(n, generator=g) < 0.5, torch.randint(0, 12, (n,), generator=g),
                      (torch.rand(n, generator=g) * (128 - e_v)).long())
    pv = torch.minimum(e_v + gap, torch.full_like(e_v, 127))
    vf, rf = exp2i(e_v), exp2i(sigma - pv)
    contract = round_to_e4m3((p * vf) * rf)
    kernel = round_to_e4m3(p * (vf * rf))
    assert (contract > 0).float().mean() > 0.05, "the draw reaches the nonzero codes"
    assert torch.equal(kernel, contract)


def test_folded_payload_gives_the_contract_codes():
    """NUMERICS.md 4, where the kernels apply the power-of-two factors: the payloads built
    from W = (P^ rq)(dP^ vf - deltad), with dO's 2^edO and Q's 2^eQ carried by the records'
    rq = ro 2^(edO + eQ) and deltad = D / 2^edO and only the factors that vary along their
    rows, give the codes of step 6's G, row by row, and the factors left out are exactly what
    the epilogues apply. Over the quantizers' exponent range but for the extremes NUMERICS.md
    names."""
    g = torch.Generator().manual_seed(11)
    rows, cols = 64, 48
    exps = lambda n: torch.randint(-40, 41, (n,), generator=g)
    pc = round_to_e4m3(torch.rand(rows, cols, generator=g) * 448)  # P^ values on the E4M3 grid
    ro, delta = torch.rand(rows, generator=g) + 0.01, torch.randn(rows, generator=g)
    dpc = torch.randn(rows, cols, generator=g) * 4000  # dO^.V^ code products
    e_q, e_k, e_v = exps(rows), exps(cols), exps(cols)  # rows are queries, as in the dQ loop
    e_do = torch.randint(-20, 21, (rows,), generator=g)  # |G| up to 2^121: fp32's normal range
    qg, kg, vf, vinv, dof = exp2i(e_q), exp2i(e_k), exp2i(e_v), exp2i(-e_v), exp2i(e_do)
    # Step 3-6 in the contract's order.
    dp = (dpc * dof[:, None]) * vf[None, :]
    ds = ((pc * ro[:, None]) * vinv[None, :]) * (dp - delta[:, None])
    big_g = (ds * qg[:, None]) * kg[None, :]
    # The kernels' W, from the records' rq and deltad.
    w = (pc * ((ro * dof) * qg)[:, None]) * (dpc * vf[None, :] - (delta / dof)[:, None])
    assert torch.equal(w, ((pc * ro[:, None]) * (dp - delta[:, None])) * qg[:, None]), "W is dS 2^(eV + eQ)"

    def row_codes(x):
        e = scale_exponent(x.abs().amax(dim=1), 448.0)
        return round_to_e4m3(x * exp2i(-e)[:, None]), e

    # dQ rows: the payload W (vinv kg) is G; the epilogue applies dQ's 2^-eQ.
    want, e_want = row_codes(big_g)
    got, e_got = row_codes(w * (vinv * kg)[None, :])
    assert torch.equal(got, want) and torch.equal(e_got, e_want)
    # dK rows (keys): the payload W^T leaves the key's vinv kg to the epilogue.
    want, e_want = row_codes(big_g.T)
    got, e_got = row_codes(w.T)
    assert torch.equal(got, want) and torch.equal(e_got + e_k - e_v, e_want)
