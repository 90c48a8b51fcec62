"""NVFP4 and power-of-two E2M1 (NUMERICS.md 1 and 6): scales rounded up so nothing clamps,
values exact in BF16, one token never affects another's codes."""
import pytest
import torch

from flamia.formats import E4M3_MAX, round_to_e2m1, round_to_e4m3
from flamia.formats.e2m1 import e2m1_codes, e2m1_decode
from flamia.formats.scales import scale_exponent
from flamia.formats.nvfp4 import NVFP4_GROUP, e4m3_round_up, quantize_nvfp4, round_e2m1_pow2

E4M3_GRID = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
E4M3_GRID = E4M3_GRID[torch.isfinite(E4M3_GRID) & (E4M3_GRID >= 0)].unique()  # ascending, 0 .. 448


def _inputs(seed=0, tokens=512, heads=4, d=128):
    """Gaussian rows with per-token magnitudes over 30 orders of magnitude, plus rows that
    probe the edges: an all-zero row, a row of one nonzero value, exact powers of two, and
    rows whose group maxima sit exactly on E4M3 grid ratios of the row max."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, heads, d, generator=g) * torch.exp(torch.randn(tokens, heads, 1, generator=g) * 15)
    x[0, 0] = 0.0
    x[1, 0] = 0.0
    x[1, 0, 5] = -3.0
    x[2, 0] = 2.0 ** torch.arange(d).remainder(40).float().sub(20)
    ratios = E4M3_GRID[-d // NVFP4_GROUP:] / E4M3_MAX                     # the largest grid values
    x[3, 0] = (ratios.repeat_interleave(NVFP4_GROUP) * 7.0).flip(0)
    return x


def _scaled(t, x, dtype):
    """x / (s * g) in ``dtype`` (fp32: exactly what the E2M1 codes round), 0 in all-zero
    groups, [..., D]."""
    s = t.scales.to(dtype).repeat_interleave(NVFP4_GROUP, -1)
    return torch.where(s > 0, x.to(dtype) / (s * t.g.to(dtype)[..., None]), 0.0)


def test_scales_are_e4m3_values_rounded_up_and_nothing_clamps():
    x = _inputs()
    t = quantize_nvfp4(x)
    assert torch.equal(round_to_e4m3(t.scales), t.scales)              # on the E4M3 grid
    assert float(t.scales.max()) <= E4M3_MAX
    nonzero = t.scales > 0
    assert float(_scaled(t, x, torch.float32).abs().max()) <= 6.0      # no code clamps
    assert float(_scaled(t, x, torch.float64).abs().max()) <= 6.0 * (1 + 2.0 ** -22)  # fp32 rounding only
    # Rounded up, and not further: the E4M3 value below each scale would not suffice (in
    # exact arithmetic its group maximum would scale above 6).
    amax16 = x.double().abs().unflatten(-1, (-1, NVFP4_GROUP)).amax(-1)
    below = E4M3_GRID[(torch.searchsorted(E4M3_GRID, t.scales) - 1).clamp(min=0)].double()
    needs = amax16 / (below * t.g.double()[..., None])
    assert bool((needs[nonzero & (below > 0)] > 6.0).all())
    # g = 2^(e - 2) with amax in (224, 448] * 2^e puts the row's largest group scale in
    # (149, 299] before rounding up: [160, 320] on the grid, the same relative precision as 448.
    rows = x.abs().amax(-1) > 0
    top = t.scales.amax(-1)[rows]
    assert bool(((top >= 160) & (top <= 320)).all())
    assert torch.equal(t.g, torch.ldexp(torch.ones_like(t.g), t.exps - 2))


def test_shared_exponents_of_a_token_block():
    """The mixed route's g shares its MXFP8 operand's token-block exponent: rows far below the
    block's maximum get smaller scales and the same codes' precision, and nothing clamps;
    exponents below a row's own maximum are refused, not clamped."""
    x = _inputs(seed=5, tokens=64)
    block = scale_exponent(x.abs().unflatten(0, (-1, 32)).amax((1, 3)), E4M3_MAX)  # [2, H]
    exps = block.repeat_interleave(32, 0)                                           # [T, H]
    t = quantize_nvfp4(x, exps)
    assert torch.equal(t.exps, exps) and float(t.scales.max()) <= E4M3_MAX
    assert float(_scaled(t, x, torch.float32).abs().max()) <= 6.0
    own = quantize_nvfp4(x)
    same = exps == own.exps
    assert torch.equal(t.codes[same], own.codes[same]) and torch.equal(t.scales[same], own.scales[same])
    with pytest.raises(AssertionError, match="448"):
        quantize_nvfp4(x * 4.0, exps)


def test_group_maxima_next_to_grid_multiples_of_the_row_scale():
    """Group maxima within two fp32 ulps of s * 6 * g for every E4M3 s: there the fp32 ratio
    can land on the grid while the group maximum still scales above 6, so rounding the
    ratio up is not enough on its own (the quantizer steps such scales up once)."""
    rows = []
    for row_max in (0.37, 1.0, 2.3, 3.0, 5.5, 7.0):
        g = quantize_nvfp4(torch.full((1, NVFP4_GROUP), row_max)).g
        t = (E4M3_GRID[1:].double() * 6 * g.double()).float()
        for direction in (0.0, 1e30):
            for _ in range(3):
                row = torch.zeros(len(t), 2 * NVFP4_GROUP)
                row[:, 0], row[:, NVFP4_GROUP] = row_max, t.clamp(max=row_max)
                rows.append(row)
                t = torch.nextafter(t, torch.tensor(direction))
    x = torch.cat(rows)
    t = quantize_nvfp4(x)
    assert float(_scaled(t, x, torch.float32).abs().max()) <= 6.0
    assert torch.equal(round_to_e4m3(t.scales), t.scales) and float(t.scales.max()) <= E4M3_MAX


def test_values_are_exact_in_bf16_and_dequantize_closely():
    x = _inputs(seed=1)
    t = quantize_nvfp4(x)
    v = t.values()
    assert torch.equal(v, v.bfloat16().float())
    gauss = torch.randn(1024, 4, 128, generator=torch.Generator().manual_seed(2))
    tg = quantize_nvfp4(gauss)
    rel = float((tg.dequantize() - gauss).norm() / gauss.norm())
    print(f"NVFP4 relative error on Gaussian rows: {rel:.4f}")
    assert 0.05 < rel < 0.11  # 4-bit codes: about 0.1, not lossless and not broken


def test_one_token_never_changes_another_tokens_codes():
    x = _inputs(seed=3, tokens=64)
    t = quantize_nvfp4(x)
    y = x.clone()
    y[17] *= 1000.0 * x.abs().amax() / x[17].abs().amax()  # now the tensor's maximum
    u = quantize_nvfp4(y)
    others = torch.arange(x.shape[0]) != 17
    for a, b in ((t.codes, u.codes), (t.scales, u.scales), (t.g, u.g)):
        assert torch.equal(a[others], b[others])
    # A tensor-wide g (the leaking ablation) does change them: the check can fail.
    tp, up = quantize_nvfp4(x, per_tensor=True), quantize_nvfp4(y, per_tensor=True)
    assert not torch.equal(tp.codes[others], up.codes[others])


def test_e4m3_round_up_on_and_between_grid_values():
    assert torch.equal(e4m3_round_up(E4M3_GRID), E4M3_GRID)
    above = torch.nextafter(E4M3_GRID[:-1], torch.tensor(1e9))
    assert torch.equal(e4m3_round_up(above), E4M3_GRID[1:])
    below = torch.nextafter(E4M3_GRID[1:], torch.tensor(0.0))
    assert torch.equal(e4m3_round_up(below), E4M3_GRID[1:])


def test_fast_e2m1_rounding_matches_the_table_rounding_including_ties():
    x = torch.arange(-6 * 4096, 6 * 4096 + 1) / 4096.0  # every tie 0.25, 0.75, ..., 5 included
    x = torch.cat([x, torch.nextafter(x, torch.tensor(9.0)).clamp(max=6.0),
                   torch.nextafter(x, torch.tensor(-9.0)).clamp(min=-6.0), torch.tensor([1e-30, -1e-45])])
    assert torch.equal(round_to_e2m1(x), e2m1_decode(e2m1_codes(x)))


def test_power_of_two_e2m1_never_clamps():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(1000, 32, generator=g) * torch.exp(torch.randn(1000, 1, generator=g) * 20)
    amax = x.abs().amax(-1, keepdim=True)
    v = round_e2m1_pow2(x, amax)
    ratio = (v.abs().amax(-1, keepdim=True) / amax).squeeze(-1)
    # The scaled group max lies in (3, 6] and rounds to 3, 4 or 6: within [4/5, 6/5] of itself
    # (5 -> 4 and just above 5 -> 6 are the extremes).
    assert float(ratio.min()) >= 0.8 and float(ratio.max()) <= 1.2
    assert torch.equal(round_e2m1_pow2(torch.zeros(3, 32), torch.zeros(3, 1)), torch.zeros(3, 32))


def test_bad_head_dim_names_the_argument():
    with pytest.raises(ValueError, match="x: NVFP4"):
        quantize_nvfp4(torch.ones(2, 3, 24))


def test_row_scale_is_a_power_of_two_from_the_row_max():
    """g = 2^(e - 2), e the smallest integer with amax <= 448 * 2^e (checked in fp64, apart
    from the bit arithmetic of ``scale_exponent``); an all-zero row takes the clamp -100."""
    x = _inputs(seed=5)
    amax = x.double().abs().amax(-1)
    t = quantize_nvfp4(x)
    e = t.exps.double()
    nonzero = amax > 0
    assert bool((amax[nonzero] <= 448 * 2.0 ** e[nonzero]).all())
    assert bool((amax[nonzero] > 448 * 2.0 ** (e[nonzero] - 1)).all())
    assert bool((e[~nonzero] == -100).all())
    assert torch.equal(t.g.double(), 2.0 ** (e - 2))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_equals_cpu_bitwise():
    """The reference is the same function on every device (the CUDA kernels match it there)."""
    x = _inputs(seed=6)
    cpu, gpu = quantize_nvfp4(x), quantize_nvfp4(x.cuda())
    for a, b in ((cpu.codes, gpu.codes), (cpu.scales, gpu.scales), (cpu.g, gpu.g)):
        assert torch.equal(a, b.cpu())
