"""cuDNN attention through the frontend's graph API: BF16 (sdpa / sdpa_backward) and FP8
with per-tensor scales (sdpa_fp8 / sdpa_fp8_backward). The graph builders, output buffers
and FP8 calls here serve the timed jobs below and the cuDNN attention callables of
``peer_attention.py``.

FP8 scale policy (paper Appendix D.1): the Q, K, V and dO scales come from each tensor's
amax inside the call (``fp8.quantize_per_tensor``), as a training step on new tensors
must. The output-side scales cuDNN needs beforehand (O, dQ, dK, dV, dP) are calibrated once
from a call with unit scales (``Fp8Scales``), on the same data; S (the probabilities, at
most 1) uses the power-of-two scale of 1. O and the gradients stay in FP8.
"""
import torch

from .cudnn_graph import Graph, GraphBuilder, PackedLayout, cudnn_module
from .fp8 import FP8, pow2_scale, quantize_per_tensor
from .jobs import check_mode, staged_job
from .timing import Job
from .workloads import Case, Workload

FWD_SCALES = ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o")
BWD_SCALES = ("descale_q", "descale_k", "descale_v", "descale_o", "descale_dO", "descale_s", "descale_dP",
              "scale_s", "scale_dQ", "scale_dK", "scale_dV", "scale_dP")
# Calibrated from these amax outputs (see the module doc); the rest are per call or fixed.
CALIBRATED = {"scale_o": "amax_o", "scale_dQ": "amax_dQ", "scale_dK": "amax_dK", "scale_dV": "amax_dV",
              "scale_dP": "amax_dP"}
FWD_AMAX = ("amax_s", "amax_o")
BWD_AMAX = ("amax_dQ", "amax_dK", "amax_dV", "amax_dP")
GRADS = ("dQ", "dK", "dV")


def _declare_qkv(builder: GraphBuilder, w: Workload, data_type) -> dict:
    return {name: builder.packed(name, heads, w.head_dim, data_type)
            for name, heads in (("q", w.heads_q), ("k", w.heads_kv), ("v", w.heads_kv))}


def _declare_grads(builder: GraphBuilder, w: Workload, grads, data_type) -> None:
    for name, tensor, heads in zip(GRADS, grads, (w.heads_q, w.heads_kv, w.heads_kv)):
        builder.packed_output(name, tensor, heads, w.head_dim, data_type)


def forward_graph(layout: PackedLayout, w: Workload, io_type, fp8: bool, stats: bool) -> Graph:
    """The forward over ``layout`` with ``w``'s heads, head dim and mask. Tensors: q, k, v,
    o; stats (fp32 [B, Hq, S, 1], the softmax logsumexp) when ``stats``; for FP8 the
    FWD_SCALES inputs and FWD_AMAX outputs."""
    builder = GraphBuilder(layout, io_type)
    qkv = _declare_qkv(builder, w, io_type)
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


def backward_graph(layout: PackedLayout, w: Workload, io_type, fp8: bool) -> Graph:
    """The backward over ``layout``. Tensors: q, k, v, o, dO, stats, dQ, dK, dV; for FP8 the
    BWD_SCALES inputs and BWD_AMAX outputs."""
    builder = GraphBuilder(layout, io_type)
    tensors = _declare_qkv(builder, w, io_type)
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
    _declare_grads(builder, w, grads, io_type)
    return builder.build()


def forward_outputs(layout: PackedLayout, q: torch.Tensor, dtype: torch.dtype, stats: bool) -> dict:
    """Fresh buffers the forward graph writes: o (``dtype``, q's shape) and, when ``stats``,
    the fp32 stats."""
    out = {"o": torch.empty(q.shape, dtype=dtype, device=q.device)}
    if stats:
        out["stats"] = layout.new_stats(q.shape[1])
    return out


def grad_outputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype) -> dict:
    """Fresh buffers the backward graph writes: dQ, dK, dV in ``dtype``."""
    return {name: torch.empty(x.shape, dtype=dtype, device=x.device) for name, x in zip(GRADS, (q, k, v))}


def _subset(tensors: dict, names) -> dict:
    return {name: tensors[name] for name in names if name in tensors}


class Fp8Scales:
    """The fp32 scalars ([1, 1, 1, 1]) of one FP8 forward/backward graph pair: the amax
    outputs, and the scales fixed between calls (S's from its bound 1; O's, dQ's, dK's,
    dV's and dP's from ``calibrate_*``, unit until then)."""

    def __init__(self, device: torch.device):
        def scalar() -> torch.Tensor:
            return torch.ones((1, 1, 1, 1), dtype=torch.float32, device=device)

        self.amax = {name: scalar() for name in (*FWD_AMAX, *BWD_AMAX)}
        self.fixed = {name: scalar() for name in (*CALIBRATED, "descale_o", "descale_dP")}
        self.fixed["scale_s"] = pow2_scale(scalar())
        self.fixed["descale_s"] = self.fixed["scale_s"].reciprocal()

    def _calibrate(self, names) -> None:
        for name in names:
            self.fixed[name].copy_(pow2_scale(self.amax[CALIBRATED[name]]))

    def calibrate_forward(self) -> None:
        """O's scale from the amax of the last forward (run with unit scales)."""
        self._calibrate(["scale_o"])
        self.fixed["descale_o"].copy_(self.fixed["scale_o"].reciprocal())

    def calibrate_backward(self) -> None:
        """dQ's, dK's, dV's and dP's scales from the amax of the last backward."""
        self._calibrate(["scale_dQ", "scale_dK", "scale_dV", "scale_dP"])
        self.fixed["descale_dP"].copy_(self.fixed["scale_dP"].reciprocal())

    def dequantize(self, x: torch.Tensor, scale: str) -> torch.Tensor:
        """FP8 codes written with the fixed ``scale`` -> float32 values (exact: the scale
        is a power of two)."""
        return x.float() * self.fixed[scale].reciprocal().reshape(())


def fp8_forward(graph: Graph, scales: Fp8Scales, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                buffers: dict) -> dict:
    """Q, K, V (bf16) quantized per tensor, then the FP8 forward into ``buffers``' o (and
    stats). Returns the state the backward reads: the codes q, k, v and their descales."""
    (q8, dq), (k8, dk), (v8, dv) = (quantize_per_tensor(x) for x in (q, k, v))
    state = dict(q=q8, k=k8, v=v8, descale_q=dq.reshape(1, 1, 1, 1), descale_k=dk.reshape(1, 1, 1, 1),
                 descale_v=dv.reshape(1, 1, 1, 1))
    graph(**state, **_subset(scales.fixed, FWD_SCALES), **_subset(buffers, ("o", "stats")),
          **_subset(scales.amax, FWD_AMAX))
    return state


def fp8_backward(graph: Graph, scales: Fp8Scales, state: dict, do: torch.Tensor, buffers: dict) -> None:
    """dO quantized per tensor, then the FP8 backward reading ``buffers``' o and stats and
    writing their dQ, dK, dV."""
    do8, descale_do = quantize_per_tensor(do)
    graph(**state, dO=do8, descale_dO=descale_do.reshape(1, 1, 1, 1), **_subset(scales.fixed, BWD_SCALES),
          **_subset(buffers, ("o", "stats", *GRADS)), **_subset(scales.amax, BWD_AMAX))


def _graphs(case: Case, io_type, fp8: bool, train: bool) -> tuple[Graph, "Graph | None"]:
    layout = PackedLayout.of(case.inputs)
    forward = forward_graph(layout, case.workload, io_type, fp8=fp8, stats=train)
    return forward, backward_graph(layout, case.workload, io_type, fp8=fp8) if train else None


def _buffers(case: Case, dtype: torch.dtype, with_grads: bool) -> dict:
    """Output buffers the graphs write, allocated once so that every call (and a captured
    graph) reuses them."""
    i = case.inputs
    grads = grad_outputs(i.q, i.k, i.v, dtype) if with_grads else {}
    return {**forward_outputs(PackedLayout.of(i), i.q, dtype, stats=with_grads), **grads}


def cudnn_bf16_job(case: Case, mode: str) -> Job:
    check_mode(mode)
    i, train = case.inputs, mode != "fwd"
    fwd_graph, bwd_graph = _graphs(case, cudnn_module().data_type.BFLOAT16, fp8=False, train=train)
    buf = _buffers(case, i.q.dtype, with_grads=train)

    def forward():
        fwd_graph(q=i.q, k=i.k, v=i.v, **_subset(buf, ("o", "stats")))

    def backward(_):
        bwd_graph(q=i.q, k=i.k, v=i.v, dO=i.do, **_subset(buf, ("o", "stats", *GRADS)))

    return staged_job(forward, backward, mode)


def cudnn_fp8_job(case: Case, mode: str) -> Job:
    check_mode(mode)
    i, train = case.inputs, mode != "fwd"
    fwd_graph, bwd_graph = _graphs(case, cudnn_module().data_type.FP8_E4M3, fp8=True, train=train)
    buf = _buffers(case, FP8, with_grads=train)
    scales = Fp8Scales(i.q.device)

    def forward():
        return fp8_forward(fwd_graph, scales, i.q, i.k, i.v, buf)

    def backward(state):
        fp8_backward(bwd_graph, scales, state, i.do, buf)

    # Calibrated outside the timed calls, from calls with unit output scales on the same data.
    forward()
    scales.calibrate_forward()
    if train:
        backward(forward())
        scales.calibrate_backward()
    return staged_job(forward, backward, mode)
