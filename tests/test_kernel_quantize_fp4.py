"""The fused NVFP4 quantizer (flamia/kernels/quantize_fp4.py) against its torch reference
(flamia/formats/nvfp4.py's quantize_nvfp4, reference/operands_fp4.py's nvfp4_operand): packed
codes, E4M3 scales and exponents bit for bit, and the Triton helpers of flamia/kernels/fp4.py against
flamia.formats value by value. Without CUDA the kernels run on Triton's CPU interpreter."""
import pytest
import torch
import triton
import triton.language as tl

from flamia.formats.e2m1 import (E2M1_VALUES, e2m1_codes, e2m1_decode, pack_e2m1, round_to_e2m1,
                                 round_to_e2m1_stochastic, unpack_e2m1)
from flamia.formats.e4m3 import E4M3_MAX
from flamia.formats.hadamard import hadamard_transform
from flamia.formats.nvfp4 import NVFP4_GROUP, e4m3_round_up, quantize_nvfp4, round_e2m1_pow2
from flamia.formats.scales import exp2i, scale_exponent
from flamia.kernels.fp4 import e2m1_codes as e2m1_codes_kernel
from flamia.kernels.fp4 import e4m3_round_up as e4m3_round_up_kernel
from flamia.kernels.fp4 import round_e2m1 as round_e2m1_kernel
from flamia.kernels.fp4 import round_e2m1_at, round_e2m1_stochastic_at
from flamia.kernels.fp4 import round_e2m1_signed as round_e2m1_signed_kernel
from flamia.kernels.fp8 import pow2
from flamia.kernels.fp8 import scale_exponent as scale_exponent_kernel
from flamia.kernels.quantize import quantize_operand, quantize_pair
from flamia.kernels.quantize_fp4 import quantize_nvfp4_operand
from flamia.kernels.worklist import tile_list
from flamia.reference.operands import quantize_operand as reference_operand
from flamia.reference.operands_fp4 import nvfp4_operand

# The interpreter's numpy warns on the 0 / 0 and x / 0 of zero scales, which the kernel
# computes where the reference does, and on the row max of a row that a NaN fills.
pytestmark = pytest.mark.filterwarnings("ignore:(invalid value|divide by zero) encountered|All-NaN:RuntimeWarning")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Odd lengths, none a multiple of 16, a 1-token and an empty document: every document but the
# first starts off the 16-token grid in the packed rows.
LENGTHS = (37, 1, 0, 70, 9)
ZERO_ROWS = slice(38, 70)  # the first 32 tokens of the 70-token document
ZERO_HEAD = 1
ZERO_GROUP = (slice(0, 20), 0, slice(16, 32))  # an all-zero 16-group inside nonzero rows
TINY_ROW, SUBNORMAL_G_ROW = 5, 6  # in head 0
HEADS = 2


def _cu_seqlens(lengths) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)


def _rows(lengths, heads: int, d: int, seed: int, dtype=torch.bfloat16) -> torch.Tensor:
    """[T, H, D] normal values with outlier channels (x20, x50, x100), zero rows ZERO_ROWS of
    head ZERO_HEAD, an all-zero group ZERO_GROUP, row TINY_ROW with a 1e6 outlier next to a
    group holding only 1e-44 (fp32 inputs: its ratio to 6 g underflows to 0, so its zero scale
    steps up to 2^-4), and row SUBNORMAL_G_ROW of magnitude 1e-37 (g is an fp32 subnormal)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(sum(lengths), heads, d, generator=g)
    x[:, :, 3] *= 20
    x[:, 0, d // 2] *= 50
    x[:, 1, 17] *= 100
    x[ZERO_ROWS, ZERO_HEAD] = 0
    x[ZERO_GROUP] = 0
    x[TINY_ROW, 0, 0] = 1e6
    x[TINY_ROW, 0, 32:48] = 0
    x[TINY_ROW, 0, 40] = 1e-44
    x[SUBNORMAL_G_ROW, 0] *= 1e-37
    return x.to(device=DEVICE, dtype=dtype)


def _bits(x: torch.Tensor) -> torch.Tensor:
    """fp32 bit patterns (int32), so that equal means bitwise equal, NaNs and zeros' signs included."""
    return x.float().contiguous().view(torch.int32)


def _assert_matches_reference(x: torch.Tensor, cu: torch.Tensor, hadamard: bool) -> None:
    got = quantize_nvfp4_operand(x, cu, hadamard)
    want = quantize_nvfp4(hadamard_transform(x) if hadamard else x.float())
    total, heads, d = x.shape
    assert got.codes.dtype == torch.uint8 and got.codes.shape == (total, heads, d // 2)
    assert got.scales.dtype == torch.float8_e4m3fn and got.scales.shape == (total, heads, d // NVFP4_GROUP)
    assert got.exps.dtype == torch.int8 and got.exps.shape == (total, heads)
    assert torch.equal(got.codes, pack_e2m1(want.codes))
    assert torch.equal(unpack_e2m1(got.codes), want.codes)  # the nibbles round-trip
    assert torch.equal(_bits(got.scales), _bits(want.scales))
    assert torch.equal(got.exps.int(), want.exps)
    # the emulator's operand: codes = code x scale x 2^-2, exponents e
    op = nvfp4_operand(x, rotate=hadamard)
    values = e2m1_decode(unpack_e2m1(got.codes)) * got.scales.float().repeat_interleave(NVFP4_GROUP, -1)
    assert torch.equal(_bits(values * 0.25), _bits(op.codes)) and torch.equal(got.exps.int(), op.exps)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("hadamard", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_matches_reference(d, hadamard, dtype):
    x = _rows(LENGTHS, HEADS, d, seed=d + hadamard, dtype=dtype)
    _assert_matches_reference(x, _cu_seqlens(LENGTHS), hadamard)


def test_fp16_and_one_group_per_row():
    """d = 16: one group per row; fp16 inputs (no tiny or huge rows: fp16 holds neither)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(sum(LENGTHS), HEADS, 16, generator=g)
    x[:, 0, 3] *= 50
    x[ZERO_ROWS, ZERO_HEAD] = 0
    _assert_matches_reference(x.to(device=DEVICE, dtype=torch.float16), _cu_seqlens(LENGTHS), False)


def test_inputs_reach_every_branch():
    """The data above exercises the zero scale stepped up from an underflowed ratio, all-zero
    rows and groups, and a row below 448 * 2^-101 (its exponent clamps at -100 and its codes
    underflow to zero, as NUMERICS.md 8 says of tiny values)."""
    x = _rows(LENGTHS, HEADS, 64, seed=64, dtype=torch.float32)
    got = quantize_nvfp4_operand(x, _cu_seqlens(LENGTHS))
    scales = got.scales.float()
    assert scales[TINY_ROW, 0, 2] == 2.0**-4  # its ratio to 6 g is 0
    assert (got.exps[ZERO_ROWS, ZERO_HEAD] == -100).all() and not got.codes[ZERO_ROWS, ZERO_HEAD].any()
    assert (scales[ZERO_GROUP[0], 0, 1] == 0).all() and not got.codes[ZERO_GROUP[0], 0, 8:16].any()
    assert got.exps[SUBNORMAL_G_ROW, 0] == -100


def test_group_maxima_next_to_grid_multiples_of_the_row_scale():
    """Group maxima within two fp32 ulps of s * 6 * g for every E4M3 s (tests/test_formats_nvfp4.py's
    construction). With g a power of two the fp32 ratio to 6 g lands above a grid value
    whenever the exact one does, so rounding it up suffices there: the step up is for ratios
    that underflow (``test_inputs_reach_every_branch``). One 32-element row per case."""
    e4m3 = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    e4m3 = e4m3[torch.isfinite(e4m3) & (e4m3 > 0)].unique()
    rows = []
    for row_max in (0.37, 3.0, 7.0):
        g = quantize_nvfp4(torch.full((1, NVFP4_GROUP), row_max)).g
        t = (e4m3.double() * 6 * g.double()).float()
        for direction in (0.0, 1e30):
            for _ in range(2):
                row = torch.zeros(len(t), 2 * NVFP4_GROUP)
                row[:, 0], row[:, NVFP4_GROUP] = row_max, t.clamp(max=row_max)
                rows.append(row)
                t = torch.nextafter(t, torch.tensor(direction))
    x = torch.cat(rows)[:, None, :].to(DEVICE)  # [T, 1, 32]
    _assert_matches_reference(x, _cu_seqlens((x.shape[0],)), False)
    got = quantize_nvfp4_operand(x, _cu_seqlens((x.shape[0],)))
    amax16 = x.abs().unflatten(-1, (-1, NVFP4_GROUP)).amax(-1)
    g = torch.ldexp(torch.ones_like(amax16[..., 0]), got.exps.int() - 2)
    rounded_up = e4m3_round_up(amax16 / (6 * g[..., None]))
    assert torch.equal(got.scales.float(), rounded_up)  # no step up
    assert float((x.abs().unflatten(-1, (-1, NVFP4_GROUP)).amax(-1) / (got.scales.float() * g[..., None])).max()) == 6.0


@pytest.mark.parametrize("hadamard", [False, True])
def test_non_finite_value_poisons_only_its_row(hadamard):
    """A NaN or an Inf makes its row's scales NaN; every other row is the clean input's, bitwise."""
    cu = _cu_seqlens(LENGTHS)
    x = _rows(LENGTHS, HEADS, 64, seed=9)
    bad = x.clone()
    bad[3, 0, 5] = float("nan")
    bad[50, 1, 7] = float("inf")
    got, clean = quantize_nvfp4_operand(bad, cu, hadamard), quantize_nvfp4_operand(x, cu, hadamard)
    poisoned = torch.zeros(x.shape[:2], dtype=torch.bool, device=DEVICE)
    poisoned[3, 0] = poisoned[50, 1] = True
    assert got.scales[poisoned].float().isnan().all()
    assert torch.equal(got.exps[~poisoned], clean.exps[~poisoned])
    assert torch.equal(got.codes[~poisoned], clean.codes[~poisoned])
    assert torch.equal(_bits(got.scales[~poisoned]), _bits(clean.scales[~poisoned]))


def test_reuses_a_work_list_and_no_tokens():
    cu = _cu_seqlens(LENGTHS)
    x = _rows(LENGTHS, HEADS, 64, seed=4)
    work = tile_list(cu, x.shape[0], 32, reverse=False, empty_docs=True)
    got, want = quantize_nvfp4_operand(x, cu, work=work), quantize_nvfp4_operand(x, cu)
    assert torch.equal(got.codes, want.codes) and torch.equal(got.exps, want.exps)
    empty = quantize_nvfp4_operand(x[:0], _cu_seqlens((0, 0)))
    assert empty.codes.shape == (0, HEADS, 32) and empty.scales.shape == (0, HEADS, 4)
    assert empty.exps.shape == (0, HEADS)


@pytest.mark.parametrize("call, match", [
    (lambda x, cu: quantize_nvfp4_operand(x[..., :48].contiguous(), cu), "x: head dim"),
    (lambda x, cu: quantize_nvfp4_operand(x.transpose(0, 1), cu), "x: expected a contiguous"),
    (lambda x, cu: quantize_nvfp4_operand(x.double(), cu), "x: expected a contiguous"),
    (lambda x, cu: quantize_nvfp4_operand(x[..., :32].contiguous(), cu, hadamard=True), "hadamard"),
    (lambda x, cu: quantize_nvfp4_operand(x, cu.long()), "cu_seqlens"),
    (lambda x, cu: quantize_nvfp4_operand(x, cu, work=torch.zeros(2, 3, dtype=torch.int32, device=DEVICE)), "work"),
])
def test_invalid_arguments_are_named(call, match):
    with pytest.raises(ValueError, match=match):
        call(_rows(LENGTHS, HEADS, 64, seed=0), _cu_seqlens(LENGTHS))


@triton.jit
def _helpers_kernel(p_x, p_codes, p_up, p_round, n, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    x = tl.load(p_x + o, mask=m, other=0.0)
    tl.store(p_codes + o, e2m1_codes_kernel(x), mask=m)
    tl.store(p_up + o, e4m3_round_up_kernel(tl.abs(x)), mask=m)
    tl.store(p_round + o, round_e2m1_kernel(tl.minimum(tl.abs(x), 6.0)), mask=m)


def _neighbours(values: torch.Tensor, ulps: int = 3) -> torch.Tensor:
    """Each fp32 value and the ``ulps`` fp32 values on either side of it."""
    bits = values.float().view(torch.int32)[:, None] + torch.arange(-ulps, ulps + 1, dtype=torch.int32)
    return bits.flatten().view(torch.float32)


def test_helpers_match_formats():
    """e2m1_codes: every E2M1 value and midpoint (ties) and their fp32 neighbours, both signs,
    beyond 6, inf, NaN; e4m3_round_up: every E4M3 value (subnormals too) and its neighbours,
    fp32 subnormals, random values over 40 binades; round_e2m1 on |x| up to 6, the same."""
    e4m3 = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    e4m3 = e4m3[torch.isfinite(e4m3) & (e4m3 > 0)]
    e2m1 = torch.tensor([0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0])
    g = torch.Generator().manual_seed(0)
    spread = torch.rand(4096, generator=g) * 2.0 ** torch.randint(-30, 9, (4096,), generator=g).float()
    x = torch.cat([_neighbours(e2m1), _neighbours(e4m3), spread.clamp(max=E4M3_MAX), torch.tensor([0.0, 1e-45, 1e-40])])
    x = x[(x >= 0) & (x <= E4M3_MAX)]
    x = torch.cat([x, -x[: x.numel() // 2]]).to(DEVICE)  # negative ones too (round-up reads |x|)
    codes = torch.empty(x.shape, dtype=torch.int32, device=DEVICE)
    up, rounded = torch.empty_like(x), torch.empty_like(x)
    _helpers_kernel[(triton.cdiv(x.numel(), 1024),)](x, codes, up, rounded, x.numel(), BLOCK=1024)
    assert torch.equal(codes, e2m1_codes(x).int())
    assert torch.equal(_bits(up), _bits(e4m3_round_up(x.abs())))
    assert torch.equal(_bits(rounded), _bits(round_to_e2m1(x.abs().clamp(max=6.0))))
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, -1e-30], device=DEVICE)
    _helpers_kernel[(1,)](special, codes, up, rounded, special.numel(), BLOCK=1024)
    assert codes[:5].tolist() == e2m1_codes(special).int().tolist() == [7, 7, 15, 0, 8]



@triton.jit
def _scaled_rounding_kernel(p_x, p_words, p_near, p_sr, G: tl.constexpr):
    """Groups of 16 values: their power-of-two E2M1 scale, then both roundings at that scale."""
    o = tl.arange(0, G)[:, None] * 16 + tl.arange(0, 16)[None, :]  # [G, 16]
    x = tl.load(p_x + o)
    e = scale_exponent_kernel(tl.max(tl.abs(x), axis=1), 2, 0x400000)[:, None]  # [G, 1]
    tl.store(p_near + o, round_e2m1_at(tl.abs(x), e))
    tl.store(p_sr + o, round_e2m1_stochastic_at(x, pow2(e), tl.load(p_words + o).to(tl.uint32, bitcast=True)))


def test_scaled_roundings_match_formats():
    """The roundings at the values' own scale (4-bit P's ``round_e2m1_at``, G's
    ``round_e2m1_stochastic_at``) equal the scaled ones of ``flamia.formats`` bit for bit:
    E2M1 values, ties and their fp32 neighbours under scales 2^-100..2^100, random values
    over 60 binades, zeros, fp32 subnormals, groups of one value; random words."""
    g = torch.Generator().manual_seed(1)
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    base = _neighbours(torch.cat([torch.tensor(E2M1_VALUES[1:]), mids]))  # [98]
    base = torch.cat([base, torch.zeros(14)]).view(7, 16)
    scales = 2.0 ** torch.tensor([-100, -60, -8, -1, 0, 3, 40, 100])
    grid = (base[None] * scales[:, None, None]).flatten(0, 1)  # [56, 16]
    spread = torch.rand(64, 16, generator=g) * 2.0 ** torch.randint(-60, 1, (64, 16), generator=g).float()
    spread = spread * 2.0 ** torch.randint(-30, 30, (64, 1), generator=g).float()
    lone = torch.zeros(8, 16)
    lone[:, 3] = torch.tensor([1e-45, 1e-40, 2.0 ** -126, 3.0, 0.7, 1e-30, 5e29, 0.0])
    x = torch.cat([grid, spread, lone]) * torch.where(torch.rand(128, 16, generator=g) < 0.5, -1.0, 1.0)
    words = torch.randint(0, 2 ** 32, x.shape, generator=g)
    near, sr = torch.empty_like(x).to(DEVICE), torch.empty_like(x).to(DEVICE)
    _scaled_rounding_kernel[(1,)](x.to(DEVICE), words.int().to(DEVICE), near, sr, G=x.shape[0])
    amax = x.abs().amax(1, keepdim=True)
    assert torch.equal(_bits(near.cpu()), _bits(round_e2m1_pow2(x.abs(), amax)))
    e = scale_exponent(amax, 6.0)
    assert torch.equal(_bits(sr.cpu()), _bits(round_to_e2m1_stochastic(x * exp2i(-e), words) * exp2i(e)))


@triton.jit
def _round_at_kernel(p_x, p_e, p_y, n, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    tl.store(p_y + o, round_e2m1_at(tl.load(p_x + o, mask=o < n), tl.load(p_e + o, mask=o < n)), mask=o < n)


def test_round_e2m1_at_flushes_under_the_largest_scales():
    """4-bit P's values (at most 2^tau) under group scales up to 2^126, which the leaking
    ablation's group maxima over masked keys reach (an infinite maximum gives 126): 0, as
    ``formats``' scaled rounding gives, where the rounding constant's exponent field for e
    itself would pass 255."""
    x = torch.tensor([0.3, 0.75, 1.0, 2.0 ** -30, 5.0, 12.0, 0.0])
    e = torch.arange(96, 127)
    xs, es = (t.flatten() for t in torch.broadcast_tensors(x[None], e[:, None]))
    y = torch.empty_like(xs).to(DEVICE)
    _round_at_kernel[(1,)](xs.to(DEVICE), es.int().to(DEVICE), y, xs.numel(), BLOCK=256)
    want = round_e2m1_pow2(xs, 6.0 * exp2i(es.float()))
    assert torch.equal(_bits(y.cpu()), _bits(want)) and not want.any()


@triton.jit
def _round_nan_kernel(p_x, p_y, p_ys, p_yat, n, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    x = tl.load(p_x + o, mask=o < n)
    tl.store(p_y + o, round_e2m1_kernel(x), mask=o < n)
    tl.store(p_ys + o, round_e2m1_signed_kernel(x), mask=o < n)
    tl.store(p_yat + o, round_e2m1_at(x, o * 0 - 3), mask=o < n)


def test_round_e2m1_keeps_every_nan():
    """A NaN of any payload stays NaN in the 4-bit P rounding: the GPU's own NaN, 0x7FFFFFFF,
    carried into the sign bit on the bit path and became -0, which dropped a poisoned row
    from O and dV on the all-4-bit route."""
    nan_bits = torch.tensor([0x7FFFFFFF, 0x7FC00000, 0x7F800001, 0x7FFF8000, -1, -0x400000], dtype=torch.int32)
    x = nan_bits.view(torch.float32).to(DEVICE)
    y, ys, yat = torch.empty_like(x), torch.empty_like(x), torch.empty_like(x)
    _round_nan_kernel[(1,)](x, y, ys, yat, x.numel(), BLOCK=8)
    assert torch.isnan(y).all() and torch.isnan(ys).all() and torch.isnan(yat).all()

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("hadamard", [False, True])
def test_real_size_matches_reference_on_gpu(hadamard):
    lengths, heads, d = (1000, 4096, 333), 16, 128
    _assert_matches_reference(_rows(lengths, heads, d, seed=7), _cu_seqlens(lengths), hadamard)


def _assert_score_codes_match(lengths, heads, d, block, hadamard, seed):
    """The mixed route's bf16 score codes, written by the MXFP8 launch of Q and K from its own
    exponents, equal the emulator's NVFP4 operand (values x 2^-2, g sharing the token-block
    exponent) bit for bit, on both operands of the launch; its transposed codes and exponents
    are the plain launch's."""
    cu = _cu_seqlens(lengths)
    q, k = _rows(lengths, heads, d, seed=seed), _rows(lengths, heads, d, seed=seed + 1)
    for x, got in zip((q, k), quantize_pair(q, k, cu, cu, block, hadamard, scores=True)):
        plain = quantize_operand(x, cu, block, hadamard)
        assert torch.equal(got.exps, plain.exps)
        assert torch.equal(got.codes_t.view(torch.uint8), plain.codes_t.view(torch.uint8))
        ref_exps = reference_operand(x.cpu(), cu.cpu(), max(lengths), block, hadamard).exps
        assert torch.equal(got.exps.int().cpu(), ref_exps)
        want = nvfp4_operand(x.cpu(), rotate=hadamard, exps=ref_exps)
        assert got.codes.dtype == torch.bfloat16 and got.codes.shape == x.shape
        assert torch.equal(_bits(got.codes.float().cpu()), _bits(want.codes))


@pytest.mark.parametrize("hadamard", [False, True])
@pytest.mark.parametrize("block", [32, 1])
def test_score_codes_match_the_mixed_routes_operand(hadamard, block):
    _assert_score_codes_match(LENGTHS, HEADS, 128, block, hadamard, seed=11)


def test_score_codes_of_ratios_that_underflow():
    """Negative values whose ratio x / (s g) lies around fp32's smallest subnormal: the
    reference's quotient is -0 (code +0) or a negative subnormal (code -0), and the kernels
    give the same sign bits (fp32 inputs; each group's maximum 2^100 sets s g near 2^97)."""
    _assert_underflow_signs()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_score_codes_of_ratios_that_underflow_on_gpu():
    """The same through the GPU's rotated Q/K launch (Gluon), which the interpreter does not run."""
    _assert_underflow_signs()


def _assert_underflow_signs():
    g = torch.Generator().manual_seed(5)
    lengths, d = (32, 32), 128
    x = -torch.ldexp(1.0 + torch.rand(sum(lengths), 1, d, generator=g),
                     torch.randint(-56, -50, (sum(lengths), 1, d), generator=g))
    x[:, :, ::NVFP4_GROUP] = 2.0 ** 100
    x = x.to(DEVICE)
    cu = _cu_seqlens(lengths)
    got = quantize_pair(x, x, cu, cu, 32, False, scores=True)[0]
    ref_exps = reference_operand(x.cpu(), cu.cpu(), max(lengths), 32, False).exps
    want = nvfp4_operand(x.cpu(), rotate=False, exps=ref_exps)
    bits = _bits(want.codes)
    assert (bits == -2**31).any() and (bits == 0).any()  # -0 and +0: both sides of the boundary
    assert torch.equal(_bits(got.codes.float().cpu()), _bits(want.codes))


@pytest.mark.parametrize("hadamard", [False, True])
def test_score_codes_of_a_non_finite_row(hadamard):
    """A NaN or an Inf in one head-dim element makes every score code of its row NaN (the
    emulator refuses such rows: their scales pass 448) and leaves the other rows' bits as
    the clean input's."""
    _assert_non_finite_rows(hadamard)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("hadamard", [False, True])
def test_score_codes_of_a_non_finite_row_on_gpu(hadamard):
    """The same through the GPU's rotated Q/K launch (Gluon), which writes the score codes of
    a row piece by piece."""
    _assert_non_finite_rows(hadamard)


def _assert_non_finite_rows(hadamard):
    cu = _cu_seqlens(LENGTHS)
    x = _rows(LENGTHS, HEADS, 128, seed=13)
    bad = x.clone()
    bad[3, 0, 100] = float("nan")  # in the last 32 head-dim elements, far from the row's first codes
    bad[50, 1, 7] = float("inf")
    got, clean = (quantize_pair(t, t, cu, cu, 32, hadamard, scores=True)[0].codes.float() for t in (bad, x))
    poisoned = torch.zeros(x.shape[:2], dtype=torch.bool, device=DEVICE)
    poisoned[3, 0] = poisoned[50, 1] = True
    assert got[poisoned].isnan().all()
    assert torch.equal(_bits(got[~poisoned]), _bits(clean[~poisoned]))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("hadamard", [False, True])
@pytest.mark.parametrize("block", [32, 1])
def test_score_codes_real_size_on_gpu(hadamard, block):
    """Per-token exponents (block 1) give every token of a 16-token group its own factor, which
    must follow the token to its column in the transposed codes' order."""
    _assert_score_codes_match((1000, 4096, 333), 16, 128, block, hadamard, seed=12)
