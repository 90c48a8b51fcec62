"""Formats: E4M3/E2M1 rounding, power-of-two exponents, token blocks, Hadamard, recipes."""
import math

import pytest
import torch

from flamia.formats import (E4M3_MAX, EXP_MIN, e2m1_codes, exp2i, e2m1_decode, hadamard_matrix, hadamard_transform,
                            pack_e2m1, quantize_token_blocks, round_to_e2m1, round_to_e4m3, scale_exponent,
                            to_e4m3, unpack_e2m1)
from flamia.recipes import RECIPES, Recipe, resolve_recipe


def test_e4m3_matches_torch_on_every_fp16_value_in_range():
    x = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.float16).float()
    x = x[torch.isfinite(x) & (x.abs() <= E4M3_MAX)]
    ours = to_e4m3(x).view(torch.uint8)
    theirs = x.to(torch.float8_e4m3fn).view(torch.uint8)
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("value, expected", [
    (448.0, 448.0), (-448.0, -448.0), (2.0 ** -9, 2.0 ** -9),  # largest, smallest subnormal
    (2.0 ** -10, 0.0),            # half the smallest subnormal: tie to even (zero)
    (3 * 2.0 ** -10, 2.0 ** -8),  # 1.5 subnormal steps: tie to the even code 2
    (2.0 ** -6 * 1.0625, 2.0 ** -6),  # half an ulp above the smallest normal: tie to even
    (1.0625, 1.0), (1.1875, 1.25), (0.0, 0.0),
])
def test_e4m3_edge_cases(value, expected):
    assert round_to_e4m3(torch.tensor([value])).item() == expected


def test_e4m3_saturates_only_when_asked():
    x = torch.tensor([1000.0])
    assert round_to_e4m3(x, saturate=True).item() == E4M3_MAX


def test_e2m1_table_and_ties():
    values = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    assert torch.equal(round_to_e2m1(values), values)
    assert torch.equal(round_to_e2m1(-values), -values)
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    assert round_to_e2m1(ties).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    codes = e2m1_codes(torch.randn(64) * 3)
    assert torch.equal(unpack_e2m1(pack_e2m1(codes)), codes)
    assert torch.equal(e2m1_decode(codes), round_to_e2m1(e2m1_decode(codes)))


def test_scale_exponent_rounds_up_and_never_clamps():
    amax = torch.tensor([448.0, 448.0 * 4, 449.0, 447.0, 1.0, 0.0, 1e-40, 3e38])
    e = scale_exponent(amax, E4M3_MAX)
    assert e.tolist()[:6] == [0, 2, 1, 0, -8, EXP_MIN]  # a max of exactly 448 * 2^k keeps k
    scaled = amax * exp2i(-e)
    assert bool((scaled <= E4M3_MAX).all())
    big = amax > 1e-30  # above the clamp, the exponent is the smallest that fits
    assert bool((amax[big] * exp2i(-(e[big] - 1)) > E4M3_MAX).all())


def test_scale_exponent_random_against_log2():
    amax = torch.rand(10000) * torch.exp2(torch.randint(-40, 40, (10000,)).float())
    e = scale_exponent(amax, E4M3_MAX)
    expected = torch.ceil(torch.log2(amax.double() / E4M3_MAX)).int()
    assert (e - expected).abs().max() <= 1  # log2 in float may be off at exact powers
    assert bool((amax * exp2i(-e) <= E4M3_MAX).all())


def _packed(lengths, heads=2, dim=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int32)
    return torch.randn(sum(lengths), heads, dim, generator=g), cu


def test_token_blocks_restart_at_documents_and_keep_short_tails():
    x, cu = _packed([40, 0, 70, 1])
    codes, exps = quantize_token_blocks(x, cu, 70)
    for start, end in [(0, 40), (40, 110), (110, 111)]:
        for b0 in range(start, end, 32):
            b1 = min(b0 + 32, end)
            amax = x[b0:b1].abs().amax(dim=(0, 2))
            assert torch.equal(exps[b0:b1].int(), scale_exponent(amax, E4M3_MAX).expand(b1 - b0, -1))
    deq = codes.float() * exp2i(exps)[..., None]
    assert torch.allclose(deq, x, rtol=2 ** -4, atol=1e-6)


def test_scaling_one_document_leaves_the_others_bitwise_unchanged():
    x, cu = _packed([33, 64, 5])
    codes, exps = quantize_token_blocks(x, cu, 64)
    y = x.clone()
    y[33:97] *= 1000
    codes2, exps2 = quantize_token_blocks(y, cu, 64)
    others = torch.cat([torch.arange(0, 33), torch.arange(97, 102)])
    assert torch.equal(codes[others].view(torch.uint8), codes2[others].view(torch.uint8))
    assert torch.equal(exps[others], exps2[others])
    assert not torch.equal(exps[33:97], exps2[33:97])


@pytest.mark.parametrize("d", [64, 128, 256])
def test_hadamard_is_orthogonal_and_its_own_inverse(d):
    h = hadamard_matrix(d)
    assert torch.allclose(h @ h, torch.eye(d), atol=1e-6)
    x = torch.randn(5, 3, d)
    assert torch.allclose(hadamard_transform(hadamard_transform(x)), x, atol=1e-5)
    assert torch.allclose(hadamard_transform(x), x @ h, atol=1e-5)


def test_hadamard_rejects_other_dims():
    with pytest.raises(ValueError, match="head_dim"):
        hadamard_transform(torch.randn(2, 96))


def test_recipe_asserts_the_saturation_bound():
    assert Recipe(tau=4, sigma=4).tau + 4 <= math.log2(448)
    with pytest.raises(ValueError, match="tau \\+ sigma"):
        Recipe(tau=4, sigma=6)
    assert not Recipe(tau=4, sigma=6, check_saturation=False).check_saturation  # only to reproduce it


def test_recipe_presets_and_errors():
    assert resolve_recipe("mxfp8") is RECIPES["mxfp8"]
    assert RECIPES["mxfp8-exact"].exact and not RECIPES["mxfp8"].exact
    assert Recipe("mxfp8").use_hadamard(128) and not Recipe("mxfp8").use_hadamard(64)
    assert not Recipe("fp4").use_hadamard(128)
    with pytest.raises(ValueError, match="recipe"):
        resolve_recipe("fp6")
    with pytest.raises(TypeError, match="recipe"):
        resolve_recipe(3)
    with pytest.raises(ValueError, match="scale_block"):
        Recipe(scale_block=16)
