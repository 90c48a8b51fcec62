"""flamia as transformers' attn_implementation="flamia": a tiny random Llama (GQA, 2 layers)
gives every document of a packed row, and every sequence of a padded batch, the logits it
gets alone; the collator's kwargs, sliding windows, autocast and the backward work."""
import math

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers import DataCollatorWithFlattening, LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.modeling_flash_attention_utils import prepare_fa_kwargs_from_position_ids  # noqa: E402

import flamia.integrations.transformers as hf  # noqa: E402

VOCAB = 64
LENGTHS = [7, 12, 5]


def tiny_llama(recipe="bf16", backend="reference", hidden=64, heads=4, device="cpu", dtype=torch.float32):
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                         num_attention_heads=heads, num_key_value_heads=heads // 2,
                         attn_implementation="flamia", flamia_recipe=recipe, flamia_backend=backend)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()


def documents(lengths=LENGTHS, device="cpu"):
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB, (1, n), generator=gen).to(device) for n in lengths]


def alone(model, docs):
    """Each document's logits from its own forward, concatenated: [1, sum(lengths), VOCAB]."""
    with torch.no_grad():
        return torch.cat([model(d, use_cache=False).logits for d in docs], 1)


def packed_position_ids(lengths, device="cpu"):
    return torch.cat([torch.arange(n, device=device) for n in lengths])[None]


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


def test_registered_names():
    assert transformers.AttentionInterface._global_mapping["flamia"] is hf.flamia_attention_forward
    assert "flamia" in transformers.masking_utils.AttentionMaskInterface._global_mapping


@pytest.mark.parametrize("recipe", ["bf16", "mxfp8"])
def test_packed_row_equals_documents_alone(recipe):
    model = tiny_llama(recipe)
    docs = documents()
    with torch.no_grad():
        packed = model(torch.cat(docs, 1), position_ids=packed_position_ids(LENGTHS), use_cache=False).logits
    # Only the linear layers' summation order differs with the row length.
    torch.testing.assert_close(packed, alone(model, docs), rtol=0, atol=1e-5)


def test_boundaries_derived_once_per_forward(model, monkeypatch):
    calls = []
    derive = hf.cu_seqlens_from_position_ids
    monkeypatch.setattr(hf, "cu_seqlens_from_position_ids", lambda p: calls.append(p) or derive(p))
    docs = documents()
    with torch.no_grad():
        for _ in range(2):
            model(torch.cat(docs, 1), position_ids=packed_position_ids(LENGTHS), use_cache=False)
    assert len(calls) == 2  # one per forward, not one per layer (2 layers)


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batch_equals_sequences_alone(model, side):
    """Positions run on through the padding (no restart that would split off the padding as
    documents of its own): only the mask keeps left padding from the real tokens."""
    docs = documents([9, 4, 6])
    width = max(d.shape[1] for d in docs)
    ids = torch.zeros(len(docs), width, dtype=torch.long)
    mask = torch.zeros(len(docs), width, dtype=torch.long)
    for row, d in enumerate(docs):
        cols = slice(width - d.shape[1], width) if side == "left" else slice(0, d.shape[1])
        ids[row, cols], mask[row, cols] = d[0], 1
    position_ids = torch.arange(width) - (mask.cumsum(-1) == 0).sum(-1, keepdim=True)
    with torch.no_grad():
        logits = model(ids, attention_mask=mask, position_ids=position_ids, use_cache=False).logits
    real = logits[mask.bool()][None]
    torch.testing.assert_close(real, alone(model, docs), rtol=0, atol=1e-5)


def test_collator_kwargs(model, monkeypatch):
    """DataCollatorWithFlattening's cu_seq_lens_q/k and max_length_q/k set the documents (the
    position-ids route is switched off here), also with max_length as a 0-d tensor and
    int64 cu_seq_lens."""
    docs = documents()
    expected = alone(model, docs)
    monkeypatch.setattr(hf, "_cu_seqlens_of", None)
    batch = DataCollatorWithFlattening(return_flash_attn_kwargs=True)(
        [{"input_ids": d[0].tolist()} for d in docs])
    assert isinstance(batch["max_length_q"], int) and batch["cu_seq_lens_q"].dtype == torch.int32
    with torch.no_grad():
        logits = model(**batch, use_cache=False).logits
        torch.testing.assert_close(logits, expected, rtol=0, atol=1e-5)
        (cu_q, cu_k), (max_q, max_k) = prepare_fa_kwargs_from_position_ids(batch["position_ids"])
        assert isinstance(max_q, torch.Tensor) and max_q.dim() == 0
        logits = model(batch["input_ids"], position_ids=batch["position_ids"], cu_seq_lens_q=cu_q.long(),
                       cu_seq_lens_k=cu_k.long(), max_length_q=max_q, max_length_k=max_k, use_cache=False).logits
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-5)


def test_backward_finite_grads():
    model = tiny_llama("mxfp8").train()
    ids = torch.cat(documents(), 1)
    loss = model(ids, position_ids=packed_position_ids(LENGTHS), labels=ids, use_cache=False).loss
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert model.model.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0


def test_autocast_casts_q_and_k_to_the_autocast_dtype(model):
    """Under autocast rotary embeddings hand q and k over in fp32 and v in bf16."""
    ids = torch.cat(documents(), 1)
    position_ids = packed_position_ids(LENGTHS)
    with torch.no_grad():
        reference = model(ids, position_ids=position_ids, use_cache=False).logits
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(ids, position_ids=position_ids, use_cache=False).logits
    assert logits.dtype == torch.bfloat16
    assert (logits.float() - reference).norm() / reference.norm() < 0.05


class _Module(torch.nn.Module):
    is_causal = True


def test_recipe_and_backend_from_call_then_config_then_default(monkeypatch):
    seen = []
    monkeypatch.setattr(hf, "flash_attn_func", lambda q, k, v, **args: seen.append(args) or torch.zeros_like(q))
    q = torch.randn(1, 2, 4, 16)
    module = _Module()
    hf.flamia_attention_forward(module, q, q, q, None)
    module.config = LlamaConfig(flamia_recipe="bf16", flamia_backend="reference")
    hf.flamia_attention_forward(module, q, q, q, None)
    hf.flamia_attention_forward(module, q, q, q, None, flamia_recipe="nvfp4")
    assert [(a["recipe"], a["backend"]) for a in seen] == [
        ("mxfp8", None), ("bf16", "reference"), ("nvfp4", "reference")]


@pytest.mark.parametrize("causal", [True, False])
def test_sliding_window_gqa_matches_masked_softmax(causal):
    """A window of w keys (the query's own included), as transformers' sliding-window masks
    mean it, against a masked softmax in float64 on the bf16-rounded inputs."""
    batch, heads, kv_heads, seq, dim, window = 2, 4, 2, 12, 16, 3
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(batch, h, seq, dim, generator=gen).bfloat16().float() for h in (heads, kv_heads, kv_heads))
    out, weights = hf.flamia_attention_forward(_Module(), q, k, v, None, scaling=0.5, sliding_window=window,
                                               is_causal=causal, flamia_recipe="bf16", flamia_backend="reference")
    assert weights is None and out.shape == (batch, seq, heads, dim)
    i, j = torch.arange(seq)[:, None], torch.arange(seq)[None, :]
    allowed = ((j <= i) if causal else ((j - i).abs() < window)) & (i - j < window)
    kk, vv = (x.double().repeat_interleave(heads // kv_heads, 1) for x in (k, v))
    scores = (q.double() @ kk.transpose(-1, -2) * 0.5).masked_fill(~allowed, -math.inf)
    expected = (scores.softmax(-1) @ vv).transpose(1, 2)
    torch.testing.assert_close(out.double(), expected, rtol=0, atol=2e-2)


def test_refuses_what_flamia_cannot_do():
    q = torch.randn(1, 2, 4, 16)
    for kwargs, name in [(dict(dropout=0.1), "dropout"), (dict(softcap=30.0), "softcap"),
                         (dict(s_aux=torch.zeros(2)), "s_aux")]:
        with pytest.raises(ValueError, match=f"^{name}:"):
            hf.flamia_attention_forward(_Module(), q, q, q, None, **kwargs)
    with pytest.raises(ValueError, match="^attention_mask:"):
        hf.flamia_attention_forward(_Module(), q, q, q, torch.ones(1, 1, 4, 4, dtype=torch.bool))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_packed_row_triton_backend():
    """MXFP8 on the Triton kernels, head dim 64, bf16: each document of a packed row gets
    the logits it gets alone, and the emulator's within bf16 noise."""
    model = tiny_llama("mxfp8", "triton", hidden=256, heads=4, device="cuda", dtype=torch.bfloat16)
    assert model.config.head_dim == 64
    lengths = [40, 77, 20]
    docs = documents(lengths, device="cuda")
    ids, position_ids = torch.cat(docs, 1), packed_position_ids(lengths, device="cuda")
    with torch.no_grad():
        packed = model(ids, position_ids=position_ids, use_cache=False).logits.float()
        expected = alone(model, docs).float()
        model.config.flamia_backend = "reference"
        emulated = model(ids, position_ids=position_ids, use_cache=False).logits.float()
    assert (packed - expected).norm() / expected.norm() < 2e-2
    assert (packed - emulated).norm() / emulated.norm() < 2e-2
