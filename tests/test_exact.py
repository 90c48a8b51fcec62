"""exact_attention against a naive per-document, per-head loop, and its autograd backward."""
import math

import pytest
import torch

from flamia.reference.exact import exact_attention


def cu_seqlens(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def naive_attention(q, k, v, lens_q, lens_k, causal, scale, window_size):
    """One torch.softmax per (document, head), mask written out from the FlashAttention rule.
    Returns out [Tq, Hq, D], lse [Hq, Tq] in float64."""
    heads_q, group = q.shape[1], q.shape[1] // k.shape[1]
    wl, wr = window_size[0], (0 if causal else window_size[1])
    out = torch.zeros(q.shape, dtype=torch.float64)
    lse = torch.full((heads_q, q.shape[0]), math.inf, dtype=torch.float64)
    sq = sk = 0
    for lq, lk in zip(lens_q, lens_k):
        i = torch.arange(lq)[:, None]
        j = torch.arange(lk)[None, :]
        seen = torch.ones(lq, lk, dtype=torch.bool)
        if wr >= 0:
            seen &= j <= i + (lk - lq) + wr
        if wl >= 0:
            seen &= j >= i + (lk - lq) - wl
        rows = seen.any(1)
        for h in range(heads_q):
            s = q[sq:sq + lq, h].double() @ k[sk:sk + lk, h // group].double().T * scale
            s = s.masked_fill(~seen, -math.inf)[rows]
            out[sq:sq + lq, h][rows] = torch.softmax(s, -1) @ v[sk:sk + lk, h // group].double()
            lse[h, sq:sq + lq][rows] = torch.logsumexp(s, -1)
        sq, sk = sq + lq, sk + lk
    return out, lse


CASES = {
    # name: (lengths_q, lengths_k, Hq, Hkv, causal, window_size)
    "non_causal": ([17, 40, 9], None, 2, 2, False, (-1, -1)),
    "causal": ([17, 40, 9], None, 2, 2, True, (-1, -1)),
    "odd_lengths": ([63, 111, 1], None, 2, 1, True, (-1, -1)),
    "window_causal": ([50, 33], None, 2, 2, True, (8, -1)),
    "window_two_sided": ([50, 33], None, 2, 2, False, (5, 3)),
    "gqa_4_to_2": ([30, 21], None, 4, 2, True, (-1, -1)),
    "gqa_6_to_1": ([30, 21], None, 6, 1, False, (-1, -1)),
    "empty_document": ([12, 0, 25, 0], None, 2, 2, True, (-1, -1)),
    "q_longer_than_k": ([20, 3, 9], [7, 3, 12], 2, 1, True, (-1, -1)),
    "q_shorter_than_k": ([5, 9, 1], [20, 9, 16], 2, 2, True, (4, -1)),
    "k_empty_document": ([6, 4], [0, 9], 2, 2, False, (-1, -1)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_matches_naive_loop(name):
    lens_q, lens_k, hq, hkv, causal, window = CASES[name]
    lens_k = lens_k or lens_q
    gen = torch.Generator().manual_seed(0)
    d = 16
    q = torch.randn(sum(lens_q), hq, d, generator=gen, dtype=torch.float64)
    k = torch.randn(sum(lens_k), hkv, d, generator=gen, dtype=torch.float64)
    v = torch.randn(sum(lens_k), hkv, d, generator=gen, dtype=torch.float64)
    out, lse = exact_attention(q, k, v, cu_seqlens(lens_q), cu_seqlens(lens_k), max(lens_q),
                               max(lens_k), causal=causal, window_size=window)
    ref_out, ref_lse = naive_attention(q, k, v, lens_q, lens_k, causal, d ** -0.5, window)
    assert out.shape == q.shape and lse.shape == (hq, q.shape[0])
    assert out.dtype == lse.dtype == torch.float64
    torch.testing.assert_close(out, ref_out, rtol=1e-12, atol=1e-12)
    # +inf rows must coincide exactly; assert_close treats equal infinities as equal.
    torch.testing.assert_close(lse, ref_lse, rtol=1e-12, atol=1e-12)


def test_rows_without_keys_have_zero_output_inf_lse_and_zero_gradient():
    # q longer than k under causal: the first Lq - Lk rows of each document see no key.
    lens_q, lens_k = [6, 5], [2, 5]
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(11, 2, 16, generator=gen, requires_grad=True)
    k = torch.randn(7, 1, 16, generator=gen, requires_grad=True)
    v = torch.randn(7, 1, 16, generator=gen, requires_grad=True)
    out, lse = exact_attention(q, k, v, cu_seqlens(lens_q), cu_seqlens(lens_k), 6, 5,
                               causal=True, dtype=torch.float32)
    blind = torch.zeros(11, dtype=torch.bool)
    blind[:4] = True
    assert out.dtype == lse.dtype == torch.float32
    assert torch.all(out[blind] == 0) and torch.all(lse[:, blind] == math.inf)
    assert torch.isfinite(out).all() and torch.isfinite(lse[:, ~blind]).all()
    (out * torch.randn(out.shape, generator=gen)).sum().backward()
    for g in (q.grad, k.grad, v.grad):
        assert torch.isfinite(g).all()
    assert torch.all(q.grad[blind] == 0) and q.grad[~blind].abs().sum() > 0


def test_scale_and_input_dtype():
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(9, 2, 32, generator=gen).bfloat16() for _ in range(3))
    cu = cu_seqlens([4, 5])
    out, lse = exact_attention(q, k, v, cu, cu, 5, 5, softmax_scale=0.3)
    ref_out, ref_lse = naive_attention(q, k, v, [4, 5], [4, 5], False, 0.3, (-1, -1))
    torch.testing.assert_close(out, ref_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("lens_q, lens_k, causal, window, with_lse", [
    ([3, 4], [3, 4], True, (-1, -1), True),
    ([4, 1, 3], [2, 3, 3], True, (1, -1), False),  # rows without keys: lse is +inf there
    ([3, 4], [5, 2], False, (2, 1), False),
])
def test_gradcheck(lens_q, lens_k, causal, window, with_lse):
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(sum(lens_q), 2, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(sum(lens_k), 1, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(sum(lens_k), 1, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    cu_q, cu_k = cu_seqlens(lens_q), cu_seqlens(lens_k)

    def fn(q, k, v):
        out, lse = exact_attention(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                   causal=causal, window_size=window)
        return (out, lse) if with_lse else out

    assert torch.autograd.gradcheck(fn, (q, k, v))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    gen = torch.Generator().manual_seed(4)
    lens = [63, 111, 1]
    q = torch.randn(175, 4, 64, generator=gen, dtype=torch.float64)
    k = torch.randn(175, 2, 64, generator=gen, dtype=torch.float64)
    v = torch.randn(175, 2, 64, generator=gen, dtype=torch.float64)
    cu = cu_seqlens(lens)
    ref = exact_attention(q, k, v, cu, cu, 111, 111, causal=True)
    got = exact_attention(q.cuda(), k.cuda(), v.cuda(), cu.cuda(), cu.cuda(), 111, 111, causal=True)
    for a, b in zip(got, ref):
        assert a.is_cuda
        torch.testing.assert_close(a.cpu(), b, rtol=1e-12, atol=1e-12)
