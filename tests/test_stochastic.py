"""The fp4 route's stochastic rounding of G (NUMERICS.md 6): the kernels draw the emulator's
random words bit for bit, the words look like independent uniform bits, the rounding is exact
and unbiased, and a call's gradients depend on its seed exactly where the contract says."""
import warnings

import pytest
import torch
import triton
import triton.language as tl

import flamia
from flamia import Recipe
from flamia.formats import E2M1_VALUES, round_to_e2m1_stochastic
from flamia.formats.random_bits import ROUND_BITS, grad_bits, round_bits, row_key
from flamia.kernels.bwd_math import grad_words
from flamia.kernels.random_bits import grad_row_parts, row_part
from flamia.workload import make_packed_inputs

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@triton.jit
def _grad_words_kernel(p_out, p_rows, p_keys, seed, row0, key0, N: tl.constexpr, M: tl.constexpr):
    o_n, o_m = tl.arange(0, N), tl.arange(0, M)
    rows, keys = tl.load(p_rows + o_n), tl.load(p_keys + o_m)
    o_out = o_n[:, None] * M + o_m[None, :]  # [N, M]
    for stream in tl.static_range(2):
        b_word = grad_words(row_part(seed, row0, rows, stream), key0, keys, 0)
        tl.store(p_out + stream * N * M + o_out, b_word.to(tl.int32, bitcast=True))


@pytest.mark.parametrize("seed", [0, 1, 987654321, 2 ** 40 + 7, 2 ** 63 - 1])
def test_kernel_words_are_the_emulators(seed):
    """Both streams, rows past 2^32 (the row key's high word) and scattered keys."""
    n, m = 16, 32
    rows = torch.arange(n, dtype=torch.int32) * 7919
    keys = torch.arange(m, dtype=torch.int32) * 104729 + 3
    row0, key0 = (2 ** 33 + 5) * (seed % 2) + 11, 1000
    out = torch.empty(2 * n * m, dtype=torch.int32, device=DEVICE)
    _grad_words_kernel[(1,)](out, rows.to(DEVICE), keys.to(DEVICE), seed, row0, key0, N=n, M=m)
    want = [grad_bits(seed, stream, row0 + rows.long()[:, None], key0 + keys.long()[None, :]) for stream in (0, 1)]
    assert torch.equal(out.cpu().long() & 0xFFFFFFFF, torch.cat(want).flatten())


@pytest.mark.parametrize("seed", [0, 1, 2 ** 64 - 1])
def test_row_parts_launch_is_the_emulators(seed):
    """``grad_row_parts``: every packed row h Tq + i of both streams, past one program's rows,
    holds its row key after mix32's first step (x ^ x >> 16)."""
    heads, total = 3, 701
    parts = grad_row_parts(seed, heads, total, DEVICE)
    assert parts.shape == (2, heads, total) and parts.dtype == torch.int32
    for stream in (0, 1):
        key = row_key(seed, stream, torch.arange(heads * total))
        assert torch.equal(parts[stream].flatten().cpu().long() & 0xFFFFFFFF, key ^ (key >> 16))


def test_seeds_out_of_range_are_named():
    for seed in (-1, 2 ** 64):
        with pytest.raises(ValueError, match="seed"):
            row_key(seed, 0, torch.zeros(1))
        with pytest.raises(ValueError, match="seed"):
            grad_row_parts(seed, 1, 1, DEVICE)


def test_words_look_like_independent_uniform_bits():
    """On a 512 x 512 tile of each stream: every bit set half the time, the rounding's bits as
    uniforms with mean 1/2 and variance 1/12, no correlation between neighbouring rows, keys or the two streams (all
    within 5 standard errors), and as many distinct words as 2^18 random ones would give."""
    rows, keys = torch.arange(512)[:, None] + 3 * 2 ** 20, torch.arange(512)[None, :] + 77
    words = [grad_bits(12345, stream, rows, keys) for stream in (0, 1)]
    n = words[0].numel()
    for w in words:
        bits = (w.flatten()[:, None] >> torch.arange(32)) & 1
        assert (bits.float().mean(0) - 0.5).abs().max() <= 5 * 0.5 / n ** 0.5
        u = _uniforms(w)
        assert abs(u.mean() - 0.5) <= 5 * (1 / 12 / n) ** 0.5
        assert abs(u.var() - 1 / 12) <= 5 * (1 / 180 / n) ** 0.5
        c = u - 0.5
        for a, b in ((c[1:], c[:-1]), (c[:, 1:], c[:, :-1]), (c[1:, 1:], c[:-1, :-1])):
            assert abs((a * b).mean() / (1 / 12)) <= 5 / a.numel() ** 0.5
        assert w.unique().numel() >= n - 3 * n * n / 2 ** 33  # birthday collisions: n^2 / 2^33 expected
    c0, c1 = (_uniforms(w) - 0.5 for w in words)
    assert abs((c0 * c1).mean() / (1 / 12)) <= 5 / n ** 0.5


def _uniforms(words: torch.Tensor) -> torch.Tensor:
    """The bits a stochastic rounding takes from each word, as uniforms in [0, 1) (fp64)."""
    return round_bits(words).double() / 2 ** ROUND_BITS


def test_stochastic_rounding_is_exact_and_unbiased():
    """Grid values stay; others go to a grid neighbour with the probability that keeps the
    mean: over stratified words the mean is x within one stratum's weight."""
    grid = torch.tensor(E2M1_VALUES)
    grid = torch.cat([grid, -grid])
    assert torch.equal(round_to_e2m1_stochastic(grid, torch.randint(0, 2 ** 32, grid.shape)), grid)
    x = torch.tensor([0.1, 0.3, -0.7, 1.2, 1.99, 2.5, -3.3, 4.5, 5.9])
    n = 4096
    words = (torch.arange(n) * (2 ** 32 // n) + 2 ** 31 // n)[:, None].expand(n, x.numel())
    rounded = round_to_e2m1_stochastic(x.expand(n, -1), words)
    assert all(set(rounded[:, i].tolist()) <= set(grid.tolist()) for i in range(x.numel()))
    spans = (rounded.amax(0) - rounded.amin(0)).abs()
    assert torch.all(spans <= torch.tensor([0.5, 0.5, 0.5, 0.5, 0.5, 1, 1, 2, 2]))  # neighbours only
    assert torch.allclose(rounded.mean(0), x, atol=2.0 / n)
    assert round_to_e2m1_stochastic(torch.tensor([7.0, -9.0]), torch.zeros(2, dtype=torch.long)).tolist() == [6.0, -6.0]


def test_stochastic_rounding_adds_the_words_top_bits():
    """A magnitude goes up exactly when the word's top 22 bits are below its 22 bits under the
    kept one: 1.25 (halfway from 1 to 1.5) and 0.3 (0.6 of the way from 0 to 0.5, through
    1.3's bits) at the words on either side of the threshold."""
    def word(r):  # a uint32 word whose top 22 bits are r
        return r << (32 - ROUND_BITS)

    x = torch.tensor([1.25, 1.25, -0.3, -0.3])
    frac03 = (torch.tensor(1.3).view(torch.int32).item() & (2 ** ROUND_BITS - 1))
    words = torch.tensor([word(2 ** 21 - 1), word(2 ** 21), word(frac03 - 1), word(frac03) + 2 ** 10 - 1])
    assert round_to_e2m1_stochastic(x, words).tolist() == [1.5, 1.0, -0.5, -0.0]


def test_round_bits_are_the_words_top_bits():
    assert round_bits(torch.tensor([0, 1023, 1024, 0xFFFFFFFF])).tolist() == [0, 0, 1, 2 ** ROUND_BITS - 1]


def test_recipe_default_and_validation():
    assert Recipe("fp4").rounds_grad_stochastically and flamia.RECIPES["fp4"].rounds_grad_stochastically
    assert not Recipe("fp4", stochastic_grad=False).rounds_grad_stochastically
    assert not any(Recipe(name).rounds_grad_stochastically for name in ("mxfp8", "nvfp4", "bf16"))
    with pytest.raises(ValueError, match="stochastic_grad"):
        Recipe("nvfp4", stochastic_grad=True)
    r = Recipe("fp4", stochastic_grad=False)
    assert Recipe.from_key(r.key) == r


def _grads(recipe, seed, inputs):
    q, k, v = (x.clone().requires_grad_() for x in (inputs.q, inputs.k, inputs.v))
    out = flamia.flash_attn_varlen_func(q, k, v, inputs.cu_seqlens, inputs.cu_seqlens, inputs.max_seqlen,
                                        inputs.max_seqlen, causal=True, recipe=recipe, backend="reference", seed=seed)
    return (out, *torch.autograd.grad(out, (q, k, v), inputs.do))


@pytest.fixture(scope="module")
def small():
    return make_packed_inputs((37, 5, 22), heads_q=2, heads_kv=1, head_dim=64)


def test_seed_decides_dq_and_dk_only(small):
    """Same seed, same bits; another seed changes dQ and dK (G's two roundings), not O or dV."""
    a, b, c = (_grads("fp4", seed, small) for seed in (3, 3, 4))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert torch.equal(a[0], c[0]) and torch.equal(a[3], c[3])
    assert not torch.equal(a[1], c[1]) and not torch.equal(a[2], c[2])


def test_seed_none_follows_torch_manual_seed(small):
    torch.manual_seed(11)
    a = _grads("fp4", None, small)
    torch.manual_seed(11)
    b = _grads("fp4", None, small)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_nearest_rounding_and_other_recipes_ignore_the_seed(small):
    for recipe in (Recipe("fp4", stochastic_grad=False), "mxfp8"):
        a, b = _grads(recipe, 1, small), _grads(recipe, 2, small)
        assert all(torch.equal(x, y) for x, y in zip(a, b)), recipe


@pytest.mark.parametrize("seed", [-1, 2 ** 63, 1.5, "7"])
def test_bad_seed_is_named(small, seed):
    with pytest.raises(ValueError, match="^seed: "):
        _grads("mxfp8", seed, small)


def test_compiled_call_takes_the_seed(small):
    """Under torch.compile (fullgraph) the seed is an op argument: the eager bits for that seed."""
    q, k, v = small.q, small.k, small.v

    def f(q, k, v):
        return flamia.flash_attn_varlen_func(q, k, v, small.cu_seqlens, small.cu_seqlens, small.max_seqlen,
                                             small.max_seqlen, causal=True, recipe="fp4", backend="reference", seed=5)

    qs, ks, vs = (x.clone().requires_grad_() for x in (q, k, v))
    out = torch.compile(f, fullgraph=True)(qs, ks, vs)
    grads = torch.autograd.grad(out, (qs, ks, vs), small.do)
    want = _grads("fp4", 5, small)
    assert torch.equal(out, want[0]) and all(torch.equal(a, b) for a, b in zip(grads, want[1:]))


def test_graph_capture_of_a_stochastic_call_warns(small, monkeypatch):
    """A CUDA graph replays its capture's random bits: the capture says so (faked on the CPU)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.warns(UserWarning, match="^seed: .*CUDA graph"):
        flamia.validation.resolve_seed(None, Recipe("fp4"))
    for recipe in (Recipe("fp4", stochastic_grad=False), Recipe("mxfp8")):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            flamia.validation.resolve_seed(None, recipe)
