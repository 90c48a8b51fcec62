"""flamia.nn: the modules are the functional API (bit for bit), position ids give the same
documents as cu_seqlens, and bad input is refused naming its argument."""
import pytest
import torch

import flamia
from flamia.nn import DocumentAttention, SelfAttention, cu_seqlens_from_position_ids

LENGTHS = [5, 11, 1, 7]
HQ, HKV, D = 4, 2, 16
ARGS = dict(recipe="mxfp8", backend="reference")


def qkv(shape, dtype=torch.bfloat16, seed=0):
    """q [*shape, HQ, D], k and v [*shape, HKV, D]."""
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, h, D, generator=gen).to(dtype) for h in (HQ, HKV, HKV))


def cu_seqlens(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def positions(lengths):
    return torch.cat([torch.arange(n) for n in lengths])


def test_cu_seqlens_from_position_ids():
    cu, max_seqlen = cu_seqlens_from_position_ids(positions(LENGTHS))
    assert cu.dtype == torch.int32 and cu.tolist() == cu_seqlens(LENGTHS).tolist() and max_seqlen == 11
    # Rows: every row starts a document, even where its positions continue the row before.
    rows = torch.tensor([[0, 1, 2, 0, 1], [2, 3, 4, 5, 6]])
    cu, max_seqlen = cu_seqlens_from_position_ids(rows)
    assert cu.tolist() == [0, 3, 5, 10] and max_seqlen == 5
    # Any jump starts a document, as in transformers' packed-sequence masks.
    assert cu_seqlens_from_position_ids(torch.tensor([3, 4, 7, 8, 9]))[0].tolist() == [0, 2, 5]


@pytest.mark.parametrize("bad, error", [
    ([0, 1, 2], TypeError), (torch.arange(3.0), ValueError), (torch.zeros(3, dtype=torch.bool), ValueError),
    (torch.zeros(1, 2, 3, dtype=torch.long), ValueError), (torch.zeros(0, dtype=torch.long), ValueError)])
def test_cu_seqlens_from_position_ids_refuses(bad, error):
    with pytest.raises(error, match="^position_ids:"):
        cu_seqlens_from_position_ids(bad)


@pytest.mark.parametrize("window_size", [(-1, -1), (4, 0)])
def test_packed_module_equals_functional(window_size):
    q, k, v = qkv([sum(LENGTHS)])
    cu = cu_seqlens(LENGTHS)
    expected = flamia.flash_attn_varlen_func(q, k, v, cu, cu, 11, 11, causal=True, window_size=window_size, **ARGS)
    attention = DocumentAttention(causal=True, window_size=window_size, **ARGS)
    assert torch.equal(attention(q, k, v, cu_seqlens=cu, max_seqlen=11), expected)
    assert torch.equal(attention(q, k, v, cu_seqlens=cu), expected)  # max_seqlen read from cu_seqlens
    assert torch.equal(attention(q, k, v, position_ids=positions(LENGTHS)), expected)


def test_batched_module_equals_functional():
    q, k, v = qkv([3, 8])
    attention = DocumentAttention(causal=False, softmax_scale=0.3, **ARGS)
    expected = flamia.flash_attn_func(q, k, v, causal=False, softmax_scale=0.3, **ARGS)
    assert torch.equal(attention(q, k, v), expected)


def test_batched_rows_of_documents():
    """[B, S] rows holding several documents each: position ids [B, S] or cu_seqlens over the
    flattened rows give the packed call's result, in [B, S, H, D]."""
    rows = [[5, 3], [8]]
    q, k, v = qkv([2, 8])
    cu = cu_seqlens([n for row in rows for n in row])
    expected = flamia.flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu, cu, 8, 8,
                                             causal=True, **ARGS).view(q.shape)
    attention = DocumentAttention(**ARGS)
    position_ids = torch.stack([torch.cat([torch.arange(n) for n in row]) for row in rows])
    assert torch.equal(attention(q, k, v, position_ids=position_ids), expected)
    assert torch.equal(attention(q, k, v, cu_seqlens=cu, max_seqlen=8), expected)


def test_autocast_gives_one_dtype():
    """Under autocast q and k may come in fp32 (rotary embeddings), v in bf16."""
    q, k, v = qkv([sum(LENGTHS)])
    cu = cu_seqlens(LENGTHS)
    attention = DocumentAttention(**ARGS)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = attention(q.float(), k.float(), v, cu_seqlens=cu)
    assert out.dtype == torch.bfloat16 and torch.equal(out, attention(q, k, v, cu_seqlens=cu))


def test_self_attention():
    torch.manual_seed(0)
    block = SelfAttention(64, n_heads=4, n_kv_heads=2, **ARGS)
    x = torch.randn(sum(LENGTHS), 64, requires_grad=True)
    cu = cu_seqlens(LENGTHS)
    out = block(x, cu, 11)
    q, k, v = block.qkv(x).split([64, 32, 32], dim=-1)
    expected = block.out(flamia.flash_attn_varlen_func(q.unflatten(-1, (4, 16)), k.unflatten(-1, (2, 16)),
                                                       v.unflatten(-1, (2, 16)), cu, cu, 11, 11, causal=True,
                                                       **ARGS).flatten(-2))
    assert torch.equal(out, expected)
    out.square().sum().backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(block.qkv.weight.grad).all()
    batched = block(x[:22].view(2, 11, 64))
    assert batched.shape == (2, 11, 64)


@pytest.mark.parametrize("make, name", [
    (lambda: SelfAttention(64, n_heads=5), "n_heads"),
    (lambda: SelfAttention(64, n_heads=4, n_kv_heads=3), "n_kv_heads"),
    (lambda: DocumentAttention(recipe="fp9"), "recipe"),
])
def test_construction_refuses(make, name):
    with pytest.raises(ValueError, match=f"^{name}:"):
        make()


def _call(**changes):
    q, k, v = qkv([sum(LENGTHS)])
    args = dict(q=q, k=k, v=v, cu_seqlens=cu_seqlens(LENGTHS), max_seqlen=None, position_ids=None)
    args.update(changes)
    attention = DocumentAttention(window_size=args.pop("window_size", (-1, -1)), **ARGS)
    return attention(**args)


@pytest.mark.parametrize("changes, error, name", [
    (dict(q=torch.zeros(2, D)), ValueError, "q"),
    (dict(q=None), TypeError, "q"),
    (dict(cu_seqlens=None), ValueError, "cu_seqlens"),
    (dict(cu_seqlens=cu_seqlens(LENGTHS).long()), ValueError, "cu_seqlens"),
    (dict(cu_seqlens=[0, 24]), TypeError, "cu_seqlens"),
    (dict(max_seqlen=0), ValueError, "max_seqlen"),
    (dict(cu_seqlens=None, max_seqlen=11), ValueError, "max_seqlen"),
    (dict(position_ids=positions(LENGTHS)), ValueError, "position_ids"),
    (dict(cu_seqlens=None, position_ids=positions(LENGTHS)[:-1]), ValueError, "position_ids"),
    (dict(v=torch.zeros(sum(LENGTHS), HKV, D, dtype=torch.float16)), ValueError, "v"),
    (dict(window_size=(2,)), ValueError, "window_size"),
])
def test_forward_refuses(changes, error, name):
    with pytest.raises(error, match=f"^{name}:"):
        _call(**changes)


def test_batched_rows_of_unequal_length_refused():
    q, _, _ = qkv([2, 8])
    _, k, v = qkv([2, 6])
    with pytest.raises(ValueError, match="^k:"):
        DocumentAttention(**ARGS)(q, k, v, position_ids=torch.arange(8).repeat(2, 1))
