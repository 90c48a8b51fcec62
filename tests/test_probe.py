"""The leakage probe: first against attention callables whose answer is known (exact
attention, V quantized in token blocks, V quantized per tensor), then the contract of
NUMERICS.md 5 on the emulator: the default MXFP8 options change earlier O, LSE and dQ only
inside the perturbed token's block, the exact options change nothing earlier, per-tensor
scales leak, and no recipe lets one document change another.
"""
import math

import pytest
import torch

from flamia.formats.token_block import dequantize_token_blocks, quantize_token_blocks
from flamia.probe import BLOCK, CAUSAL, QUANTITIES, probe, raise_token, relative_change
from flamia.recipes import Recipe
from flamia.reference.exact import exact_attention
from flamia.reference.operands import quantize_per_tensor
from flamia.workload import exact_reference, make_packed_inputs

# Document 0 spans two 128-key forward tiles; a single-token document rides along; GQA 2:1.
LENGTHS = (150, 37, 1, 20)
# Cuts in document 0 on block boundaries (64, 128: also a tile boundary) and off them.
ON_BOUNDARY, OFF_BOUNDARY = (64, 128), (45, 141)
CUTS = ON_BOUNDARY + OFF_BOUNDARY


@pytest.fixture(scope="module")
def inputs():
    return make_packed_inputs(LENGTHS, heads_q=2, heads_kv=1, head_dim=128)


def with_quantized_v(dequantized):
    """Exact fp32 attention on V replaced by ``dequantized(v, cu_seqlens_k, max_seqlen_k)``,
    gradients passed straight through to v."""

    def attn(q, k, v, cu_q, cu_k, max_q, max_k, causal):
        v32 = v.float()
        v_used = dequantized(v, cu_k, max_k) + (v32 - v32.detach())  # the value is exactly the quantized one
        return exact_attention(q, k, v_used, cu_q, cu_k, max_q, max_k, causal=causal, dtype=torch.float32)

    return attn


def token_block_v(v, cu, max_seqlen):
    return dequantize_token_blocks(*quantize_token_blocks(v, cu, max_seqlen, BLOCK))


def per_tensor_v(v, cu, max_seqlen):
    return quantize_per_tensor(v).dequantize()


def assert_no_earlier_change_before_block(report):
    for p in report.causal:
        assert all(p.before_block[n] == 0.0 or p.before_block[n] is None for n in CAUSAL), (p.cut, p.before_block)
        assert p.farthest <= p.cut - p.block_start < BLOCK
        if p.cut in ON_BOUNDARY:
            assert p.in_block == dict.fromkeys(QUANTITIES) and p.farthest == 0


def assert_documents_isolated(report):
    for changes in [p.other_docs for p in report.causal] + [report.documents.other_docs]:
        assert all(c == 0.0 for c in changes.values()), changes


def assert_perturbation_reached_earlier_keys(report):
    # dK of earlier keys depends on the later query t: if it did not change, t was not raised.
    assert all(p.before_block["dK"] > 0 for p in report.causal if p.block_start > 0)


def test_relative_change_is_zero_only_when_bitwise_equal():
    old = torch.tensor([[1.0, -4.0], [2.0, math.inf]])
    assert relative_change(old.clone(), old) == 0.0
    assert relative_change(old[:0], old[:0]) is None
    new = old.clone()
    new[0, 0] += 2.0 ** -20
    assert relative_change(new, old) == pytest.approx(2.0 ** -20 / 4.0)
    new[1, 0] = math.nan
    assert math.isnan(relative_change(new, old))


def test_raise_token_makes_it_the_tensor_maximum(inputs):
    row, boost = 45, 8.0
    raised = raise_token(inputs, row, boost)
    for name in ("q", "k", "v"):
        before, after = getattr(inputs, name).float(), getattr(raised, name).float()
        assert after[row].abs().amax(-1).min() >= boost * before.abs().max()
        factor = after[row] / before[row]
        assert torch.equal(factor, factor.flatten()[0].expand_as(factor))  # one factor, every head
        assert math.log2(float(factor.flatten()[0])).is_integer()  # a power of two: exact
        others = torch.arange(len(before)) != row
        assert torch.equal(after[others], before[others])
    assert torch.equal(raised.do, inputs.do)


def test_probe_of_exact_attention_sees_no_earlier_change(inputs):
    report = probe(exact_reference(torch.float32), inputs, cuts=CUTS)
    assert report.verdict == "exact: no earlier change"
    assert_documents_isolated(report)
    assert_perturbation_reached_earlier_keys(report)


def test_probe_finds_the_in_block_residue_of_token_block_scales(inputs):
    report = probe(with_quantized_v(token_block_v), inputs, cuts=CUTS)
    assert report.verdict.startswith("block-local"), report.format()
    assert_no_earlier_change_before_block(report)
    assert all(p.in_block["O"] > 0 for p in report.causal if p.cut in OFF_BOUNDARY)
    assert_documents_isolated(report)


def test_probe_finds_the_leak_of_per_tensor_scales(inputs):
    report = probe(with_quantized_v(per_tensor_v), inputs, cuts=CUTS)
    assert report.verdict.startswith("LEAKS"), report.format()
    assert all(p.before_block["O"] > 0 for p in report.causal)
    assert report.documents.other_docs["O"] > 0


def test_format_shows_every_cut_and_the_verdict(inputs):
    report = probe(exact_reference(torch.float32), inputs, cuts=(45,))
    text = report.format()
    assert "before block" in text and "in block" in text and "other docs" in text
    assert text.splitlines()[-1] == f"verdict: {report.verdict}"


def test_cut_outside_the_document_names_the_argument(inputs):
    with pytest.raises(ValueError, match="cuts"):
        probe(exact_reference(torch.float32), inputs, cuts=(LENGTHS[0],))


def test_mxfp8_default_changes_earlier_outputs_only_inside_the_block(inputs):
    report = probe("mxfp8", inputs, cuts=CUTS, backend="reference")
    print(report.format())
    assert report.verdict.startswith(("block-local", "exact")), report.format()
    assert_no_earlier_change_before_block(report)
    assert_documents_isolated(report)
    assert_perturbation_reached_earlier_keys(report)


def test_mxfp8_exact_options_change_nothing_earlier(inputs):
    report = probe("mxfp8-exact", inputs, cuts=CUTS, backend="reference")
    print(report.format())
    assert report.verdict == "exact: no earlier change", report.format()
    for p in report.causal:
        assert all(p.before_block[n] in (0.0, None) and p.in_block[n] in (0.0, None) for n in CAUSAL)
    assert_documents_isolated(report)
    assert_perturbation_reached_earlier_keys(report)


def test_per_tensor_scales_are_shown_to_leak(inputs):
    report = probe(Recipe("mxfp8", per_tensor_scales=True), inputs, cuts=CUTS, backend="reference")
    print(report.format())
    assert report.verdict.startswith("LEAKS"), report.format()
    assert any(p.before_block["O"] > 0 for p in report.causal)
    assert report.documents.other_docs["O"] > 0


@pytest.mark.parametrize("recipe", ["mxfp8", "nvfp4", "fp4", "bf16"])
def test_other_documents_are_bitwise_unchanged(inputs, recipe):
    report = probe(recipe, inputs, cuts=(), scaled_doc=1, backend="reference")
    print(report.format())
    assert report.documents.doc == 1
    assert_documents_isolated(report)
    assert report.verdict == "isolated: no other document changes"
