"""cuDNN attention through the frontend's graph API: BF16 (sdpa / sdpa_backward) and FP8
with per-tensor scales (sdpa_fp8 / sdpa_fp8_backward).

FP8 scale policy (paper Appendix D.1): the Q, K, V and dO scales come from each tensor's
amax inside the timed call (``fp8.quantize_per_tensor``), as a training step on new tensors
must. The output-side scales cuDNN needs beforehand (O, dQ, dK, dV, dP) are calibrated once
outside the timed region from a call with unit scales, on the same data; S (the
probabilities, at most 1) uses the power-of-two scale of 1. O and the gradients stay in FP8.
"""
import torch

from .cudnn_graph import GraphBuilder, PackedLayout, cudnn_module
from .fp8 import pow2_scale, quantize_per_tensor
from .jobs import check_mode, staged_job
from .timing import Job
from .workloads import Case

FWD_SCALES = ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o")
BWD_SCALES = ("descale_q", "descale_k", "descale_v", "descale_o", "descale_dO", "descale_s", "descale_dP",
              "scale_s", "scale_dQ", "scale_dK", "scale_dV", "scale_dP")
# Calibrated from these amax outputs (see the module doc); the rest are per call or fixed.
CALIBRATED = {"scale_o": "amax_o", "scale_dQ": "amax_dQ", "scale_dK": "amax_dK", "scale_dV": "amax_dV",
              "scale_dP": "amax_dP"}
FWD_AMAX = ("amax_s", "amax_o")
BWD_AMAX = ("amax_dQ", "amax_dK", "amax_dV", "amax_dP")
GRADS = ("dQ", "dK", "dV")


def _declare_qkv(builder: GraphBuilder, case: Case, data_type) -> dict:
    w = case.workload
    return {name: builder.packed(name, heads, w.head_dim, data_type)
            for name, heads in (("q", w.heads_q), ("k", w.heads_kv), ("v", w.heads_kv))}


def _declare_grads(builder: GraphBuilder, case: Case, grads, data_type) -> None:
    w = case.workload
    for name, tensor, heads in zip(GRADS, grads, (w.heads_q, w.heads_kv, w.heads_kv)):
        builder.packed_output(name, tensor, heads, w.head_dim, data_type)


def _forward_graph(case: Case, io_type, fp8: bool, stats: bool):
    w = case.workload
    builder = GraphBuilder(PackedLayout.of(case.inputs), io_type)
    qkv = _declare_qkv(builder, case, io_type)
    masking = builder.masking(w.causal, w.head_dim)
    if fp8:
        scales = {name: builder.scalar(name) for name in FWD_SCALES}
        o, lse, *amaxes = builder.graph.sdpa_fp8(name="sdpa_fp8", **qkv, **scales, generate_stats=stats, **masking)
        for name, amax in zip(FWD_AMAX, amaxes):
            builder.scalar_output(name, amax)
    else:
        o, lse = builder.graph.sdpa(name="sdpa", **qkv, generate_stats=stats, **masking)
    builder.packed_output("o", o, w.heads_q, w.head_dim, io_type)
    if stats:
        builder.stats_output("stats", lse, w.heads_q)
    return builder.build()


def _backward_graph(case: Case, io_type, fp8: bool):
    w = case.workload
    builder = GraphBuilder(PackedLayout.of(case.inputs), io_type)
    tensors = _declare_qkv(builder, case, io_type)
    tensors.update(o=builder.packed("o", w.heads_q, w.head_dim, io_type),
                   dO=builder.packed("dO", w.heads_q, w.head_dim, io_type),
                   stats=builder.stats("stats", w.heads_q))
    masking = builder.masking(w.causal, w.head_dim, backward=True)
    if fp8:
        scales = {name: builder.scalar(name) for name in BWD_SCALES}
        outputs = builder.graph.sdpa_fp8_backward(name="sdpa_fp8_backward", **tensors, **scales, **masking)
        grads = outputs[:len(GRADS)]
        for name, amax in zip(BWD_AMAX, outputs[len(GRADS):]):
            builder.scalar_output(name, amax)
    else:
        grads = builder.graph.sdpa_backward(name="sdpa_backward", **tensors, **masking)
    _declare_grads(builder, case, grads, io_type)
    return builder.build()


def _buffers(case: Case, dtype: torch.dtype, with_grads: bool) -> dict:
    """Output buffers the graphs write, allocated once so that every call (and a captured
    graph) reuses them."""
    i, layout = case.inputs, PackedLayout.of(case.inputs)
    out = {"o": torch.empty(i.q.shape, dtype=dtype, device=i.q.device)}
    if with_grads:
        out["stats"] = layout.new_stats(case.workload.heads_q)
        out.update({name: torch.empty(x.shape, dtype=dtype, device=x.device)
                    for name, x in zip(GRADS, (i.q, i.k, i.v))})
    return out


def _subset(tensors: dict, names) -> dict:
    return {name: tensors[name] for name in names if name in tensors}


def cudnn_bf16_job(case: Case, mode: str) -> Job:
    check_mode(mode)
    bf16 = cudnn_module().data_type.BFLOAT16
    i, train = case.inputs, mode != "fwd"
    fwd_graph = _forward_graph(case, bf16, fp8=False, stats=train)
    bwd_graph = _backward_graph(case, bf16, fp8=False) if train else None
    buf = _buffers(case, i.q.dtype, with_grads=train)

    def forward():
        fwd_graph(q=i.q, k=i.k, v=i.v, **_subset(buf, ("o", "stats")))

    def backward(_):
        bwd_graph(q=i.q, k=i.k, v=i.v, dO=i.do, **_subset(buf, ("o", "stats", *GRADS)))

    return staged_job(forward, backward, mode)


def cudnn_fp8_job(case: Case, mode: str) -> Job:
    check_mode(mode)
    e4m3 = cudnn_module().data_type.FP8_E4M3
    i, train = case.inputs, mode != "fwd"
    fwd_graph = _forward_graph(case, e4m3, fp8=True, stats=train)
    bwd_graph = _backward_graph(case, e4m3, fp8=True) if train else None
    buf = _buffers(case, torch.float8_e4m3fn, with_grads=train)

    def scalar(value: float = 1.0) -> torch.Tensor:
        return torch.full((1, 1, 1, 1), value, dtype=torch.float32, device=i.q.device)

    amax = {name: scalar() for name in (*FWD_AMAX, *BWD_AMAX)}
    # Scales fixed before the timed calls: S's from its bound 1, the rest calibrated below.
    fixed = {name: scalar() for name in (*CALIBRATED, "descale_o", "descale_dP")}
    fixed["scale_s"] = pow2_scale(scalar())
    fixed["descale_s"] = fixed["scale_s"].reciprocal()

    def forward():
        (q, dq), (k, dk), (v, dv) = (quantize_per_tensor(x) for x in (i.q, i.k, i.v))
        state = dict(q=q, k=k, v=v, descale_q=dq.reshape(1, 1, 1, 1), descale_k=dk.reshape(1, 1, 1, 1),
                     descale_v=dv.reshape(1, 1, 1, 1))
        fwd_graph(**state, **_subset(fixed, FWD_SCALES), **_subset(buf, ("o", "stats")),
                  **_subset(amax, FWD_AMAX))
        return state

    def backward(state):
        do, descale_do = quantize_per_tensor(i.do)
        bwd_graph(**state, dO=do, descale_dO=descale_do.reshape(1, 1, 1, 1), **_subset(fixed, BWD_SCALES),
                  **_subset(buf, ("o", "stats", *GRADS)), **_subset(amax, BWD_AMAX))

    def calibrate(names) -> None:
        for name in names:
            fixed[name].copy_(pow2_scale(amax[CALIBRATED[name]]))

    forward()
    calibrate(["scale_o"])
    fixed["descale_o"].copy_(fixed["scale_o"].reciprocal())
    if train:
        backward(forward())
        calibrate(["scale_dQ", "scale_dK", "scale_dV", "scale_dP"])
        fixed["descale_dP"].copy_(fixed["scale_dP"].reciprocal())
    return staged_job(forward, backward, mode)
