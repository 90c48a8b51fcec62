"""The launches that the training call fuses (flamia/kernels/ops.py): the plan launch
(flamia/kernels/plan.py) against the separate work lists and document starts it replaces,
and the key and query records that the V and dO quantizer launches write against their own
builders (flamia/kernels/records.py), bit for bit. Without CUDA the kernels run on Triton's
CPU interpreter."""
import pytest
import torch

from flamia.kernels.configs import QUANTIZER, tiles_for
from flamia.kernels.layout import aligned_starts
from flamia.kernels.plan import build_plan, plan_layout
from flamia.kernels.prefix import prefix_v_exponent
from flamia.kernels.quantize import quantize_grad_output, quantize_operand
from flamia.kernels.records import key_records, query_records
from flamia.kernels.worklist import tile_list

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _cu(lengths) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("lengths_q,lengths_k", [((37, 1, 0, 70, 9), None), ((37, 1, 0, 70, 9), (5, 130, 1, 0, 64))])
def test_plan_equals_separate_launches(head_dim, lengths_q, lengths_k):
    tiles = tiles_for(head_dim)
    cu_q = _cu(lengths_q)
    cu_k = cu_q if lengths_k is None else _cu(lengths_k)
    tq, tk = sum(lengths_q), sum(lengths_k or lengths_q)
    plan = build_plan(cu_q, cu_k, tq, tk, tiles)
    assert torch.equal(plan.cu_qt, aligned_starts(cu_q)) and torch.equal(plan.cu_kt, aligned_starts(cu_k))
    assert (plan.cu_kt is plan.cu_qt) == (lengths_k is None)
    unit = QUANTIZER.operand_unit
    want = {"q_operand": tile_list(cu_q, tq, unit, reverse=False, empty_docs=True),
            "k_operand": tile_list(cu_k, tk, unit, reverse=False, empty_docs=True),
            "fwd": tile_list(cu_q, tq, tiles.fwd_block_m, reverse=True),
            "grad_out": tile_list(cu_q, tq, tiles.bwd_block_m, reverse=False, empty_docs=True),
            "dkdv": tile_list(cu_k, tk, tiles.bwd_block_n, reverse=False),
            "dq": tile_list(cu_q, tq, tiles.dq_block_m, reverse=True)}
    for name, work in want.items():
        assert torch.equal(plan.work(name), work), name
    layout = plan_layout(tq, tk, len(lengths_q), tiles)
    assert plan.layout == layout and plan.buffer.numel() == layout.words


@pytest.mark.parametrize("heads_q,heads_kv,block", [(4, 2, 32), (2, 2, 1)])
def test_fused_records_equal_their_builders(heads_q, heads_kv, block):
    lengths, d, sigma = (37, 1, 0, 70, 9), 64, 4
    cu = _cu(lengths)
    t = sum(lengths)
    g = torch.Generator().manual_seed(heads_q + block)

    def rows(heads, scale=1.0):
        return (torch.randn(t, heads, d, generator=g) * scale).to(DEVICE, torch.bfloat16)

    q, k, v = rows(heads_q), rows(heads_kv, 30.0), rows(heads_kv, 1e-3)
    qq = quantize_operand(q, cu, block)
    kq = quantize_operand(k, cu, block)
    vq = quantize_operand(v, cu, block, key_exps=kq.exps)
    assert torch.equal(vq.key_rec, key_records(kq.exps, vq.exps))
    assert torch.equal(vq.codes.view(torch.uint8), quantize_operand(v, cu, block).codes.view(torch.uint8))

    pv = prefix_v_exponent(vq.exps, cu, cu, t, True, (-1, -1), block)
    m = torch.randn(heads_q, t, generator=g) * 40
    ro = torch.rand(heads_q, t, generator=g) * 2.0 ** torch.randint(-20, 20, (heads_q, t), generator=g).float()
    m[0, :3] = torch.tensor([float("inf"), float("-inf"), -0.0])
    ro[:, ::7] = 0
    m, ro = m.to(DEVICE), ro.to(DEVICE)
    do, o = rows(heads_q), rows(heads_q)
    go = quantize_grad_output(do, o, ro, cu, block, 64, q_exps=qq.exps, pv=pv, m=m, sigma=sigma)
    want = query_records(qq.exps, go.do_exps, pv, m, ro, go.delta, sigma)
    assert torch.equal(go.records, want)
    plain = quantize_grad_output(do, o, ro, cu, block, 64)
    assert plain.records is None and torch.equal(plain.delta, go.delta)
