"""Peer attention libraries as attention callables (``flamia.workload``'s protocol), so that
the accuracy report (paper Table 4) and the leakage probe (Table 5) run on them as on
flamia's recipes.

    fa2:bf16         FlashAttention-2 varlen: the aten ops behind SDPA, forward and backward
    flex:bf16        FlexAttention with a document mask (``peers_torch.py``), forward and backward
    cudnn:bf16       cuDNN frontend sdpa / sdpa_backward graphs (``peers_cudnn.py``)
    cudnn:fp8        cuDNN frontend sdpa_fp8 / sdpa_fp8_backward, per-tensor scales
    flashinfer:bf16  FlashInfer ragged prefill (``peers_inference.py``), forward only
    flashinfer:fp8   the same with per-tensor FP8 Q, K, V, forward only
    fa4:bf16         FlashAttention-4, ``flash_attn.cute.flash_attn_varlen_func``

Where each may run is the benchmark's registry (``providers.py``): its installation checks
and its rules. ``peer_attention`` raises ``PeerUnavailable`` with the reason when the peer
cannot run on the inputs, and returns a ``flamia.workload.ForwardOnly`` callable when only
its backward cannot (cuDNN FP8 on Hopper: dense equal lengths and d=128 only).

lse is the library's softmax logsumexp, moved to [Hq, Tq]: aten and FA4 return it packed
(a padded per-document [B, Hq, S], as older FlashAttention-2 builds wrote, is read too),
cuDNN writes padded stats [B, Hq, S, 1], FlexAttention [1, Hq, T]. FlashInfer's callables
return none (its lse is in base 2, and the probe reads O alone of a forward-only peer).

cuDNN FP8 follows the benchmark's scale policy (``peers_cudnn.py``) across calls: Q, K, V
and dO scales from each call's amax; O's, dQ's, dK's, dV's and dP's calibrated on the first
call of a graph and then kept, like delayed scaling. So the probe's perturbed calls reuse
the baseline's output scales, and what leaks comes from the per-tensor input scales. O and
the gradients come back dequantized (FP8 codes times powers of two: exact in bf16 and fp32).
"""
import functools
import inspect
import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..varlen import token_doc_positions
from ..workload import Attention, ForwardOnly, PackedInputs
from .cudnn_graph import Graph, PackedLayout, cudnn_module
from .fp8 import FP8
from .peers_cudnn import (GRADS, Fp8Scales, backward_graph, forward_graph, forward_outputs, fp8_backward,
                          fp8_forward, grad_outputs)
from .peers_inference import flashinfer_prefill
from .peers_torch import flex_document_attention
from .providers import Provider, registry
from .workloads import Workload

PEERS = ("fa2:bf16", "flex:bf16", "cudnn:bf16", "cudnn:fp8", "flashinfer:bf16", "flashinfer:fp8", "fa4:bf16")
# fp8_forward's state, in the order the FP8 forward saves it for the backward
FP8_STATE = ("q", "k", "v", "descale_q", "descale_k", "descale_v")


class PeerUnavailable(Exception):
    """A peer cannot run on these inputs here; the message is the reason ("needs CUDA",
    "not installed: ...", a provider rule)."""


def select_peers(spec: str) -> tuple[str, ...]:
    """"all", or comma-separated keys ("cudnn:fp8") and names ("cudnn": all its recipes)
    -> keys in ``PEERS`` order."""
    tokens = [t.strip() for t in spec.split(",") if t.strip()]
    if tokens == ["all"]:
        return PEERS
    known = set(PEERS) | {key.split(":")[0] for key in PEERS}
    unknown = [t for t in tokens if t not in known]
    if unknown or not tokens:
        raise ValueError(f"--peers: unknown {unknown or spec!r}; choose 'all' or among {sorted(known)}")
    return tuple(key for key in PEERS if key in tokens or key.split(":")[0] in tokens)


def peer_attention(key: str, inputs: PackedInputs, causal: bool = True) -> Attention:
    """The attention callable of peer ``key`` for ``inputs``' documents, heads and head dim
    (bf16 on CUDA): differentiable, or ``ForwardOnly`` where the peer's backward does not
    support them. Raises ``PeerUnavailable`` with the reason when the peer cannot run."""
    if key not in PEERS:
        raise ValueError(f"key: unknown peer {key!r}; choose among {list(PEERS)}")
    provider = _providers()[key]
    workload = Workload(key, inputs.lengths, causal=causal, heads_q=inputs.q.shape[1],
                        heads_kv=inputs.k.shape[1], head_dim=inputs.q.shape[2])
    why = provider.available() or _input_problem(inputs) or provider.unsupported(workload, "fwd")
    if why:
        raise PeerUnavailable(why)
    no_backward = provider.unsupported(workload, "train")
    attn = _BUILDERS[key](no_backward is None)
    return ForwardOnly(attn, no_backward) if no_backward else attn


@functools.cache
def _providers() -> dict[str, Provider]:
    return {p.key: p for p in registry() if p.key in PEERS}


def _input_problem(inputs: PackedInputs) -> "str | None":
    if inputs.q.device.type != "cuda":
        return f"needs inputs on CUDA, got {inputs.q.device}"
    if inputs.q.dtype != torch.bfloat16:
        return f"needs bf16 inputs, got {inputs.q.dtype}"
    return None


def packed_lse(lse: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int, q: torch.Tensor,
               who: str) -> torch.Tensor:
    """A library's logsumexp -> lse fp32 [Hq, Tq]. It is either packed already, [Hq, Tq],
    or padded per document, [B, Hq, S >= max_seqlen] with position i of document b at
    [b, :, i]; any other shape is an error naming the library ``who``."""
    total, heads = q.shape[:2]
    batch = cu_seqlens.numel() - 1
    if tuple(lse.shape) == (heads, total):
        return lse
    if lse.dim() == 3 and tuple(lse.shape[:2]) == (batch, heads) and lse.shape[2] >= max_seqlen:
        doc, pos = token_doc_positions(cu_seqlens, total)
        return lse[doc, :, pos].transpose(0, 1)  # [T, Hq] -> [Hq, T]
    raise RuntimeError(f"{who}: logsumexp of shape {tuple(lse.shape)}, expected packed [Hq, Tq] = "
                       f"[{heads}, {total}] or padded [B, Hq, >= max_seqlen] = [{batch}, {heads}, >= {max_seqlen}]")


@dataclass(frozen=True)
class _Call:
    """The non-tensor side of one attention call (cu_seqlens int32 [B + 1])."""

    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_q: int
    max_k: int
    causal: bool


class _StagedFunction(torch.autograd.Function):
    """Autograd glue of a peer called as two stages: ``stages.forward(q, k, v, call) ->
    (out, lse, saved tensors)`` and ``stages.backward(saved, do, call) -> (dq, dk, dv)``."""

    @staticmethod
    def forward(ctx, q, k, v, stages, call):
        out, lse, saved = stages.forward(q, k, v, call)
        ctx.save_for_backward(*saved)
        ctx.stages, ctx.call = stages, call
        if lse is not None:
            ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        return (*ctx.stages.backward(ctx.saved_tensors, dout.contiguous(), ctx.call), None, None)


class _StagedAttention:
    """An attention callable named ``name`` over a peer's forward and backward stages."""

    def __init__(self, name: str, stages):
        self.__name__, self._stages = name, stages

    def __call__(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal):
        call = _Call(cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), bool(causal))
        return _StagedFunction.apply(q, k, v, self._stages, call)


def _softmax_scale(q: torch.Tensor) -> float:
    return 1.0 / math.sqrt(q.shape[-1])


class _Fa2:
    """aten._flash_attention_forward / _backward on packed rows, dropout 0, the calls of
    ``peers_torch.fa2_job``."""

    def forward(self, q, k, v, c: _Call):
        out, lse, rng_state, unused, _ = torch.ops.aten._flash_attention_forward(
            q, k, v, c.cu_q, c.cu_k, c.max_q, c.max_k, 0.0, c.causal, False, scale=_softmax_scale(q))
        packed = packed_lse(lse, c.cu_q, c.max_q, q, "fa2:bf16 (aten._flash_attention_forward)")
        return out, packed, (q, k, v, out, lse, rng_state, unused)

    def backward(self, saved, do, c: _Call):
        q, k, v, out, lse, rng_state, unused = saved
        return torch.ops.aten._flash_attention_backward(do, q, k, v, out, lse, c.cu_q, c.cu_k, c.max_q, c.max_k,
                                                        0.0, c.causal, rng_state, unused, scale=_softmax_scale(q))


@dataclass
class _CudnnGraphs:
    """The built graphs of one shape; ``scales`` and ``calibrated`` (the stages whose
    output scales are set) for FP8 only."""

    layout: PackedLayout
    forward: Graph
    backward: "Graph | None"
    scales: "Fp8Scales | None"
    calibrated: set = field(default_factory=set)


class _Cudnn:
    """cuDNN graphs built on first use for each (lengths, heads, KV heads, head dim, mask,
    device) and kept. ``with_backward`` False builds the forward alone, without stats: the
    FP8 forward the benchmark runs where its backward cannot (ragged lengths, d != 128)."""

    fp8 = False

    def __init__(self, with_backward: bool):
        self.with_backward = with_backward
        self._built: dict[tuple, _CudnnGraphs] = {}

    def graphs(self, q: torch.Tensor, k: torch.Tensor, c: _Call) -> _CudnnGraphs:
        if not torch.equal(c.cu_q, c.cu_k):
            raise ValueError("cu_seqlens_k: the cuDNN peers attend each document to itself; it must equal cu_seqlens_q")
        lengths = tuple(int(n) for n in torch.diff(c.cu_q).tolist())
        key = (lengths, q.shape[1], k.shape[1], q.shape[2], c.causal, q.device)
        if key not in self._built:
            data_type = cudnn_module().data_type
            io_type = data_type.FP8_E4M3 if self.fp8 else data_type.BFLOAT16
            layout = PackedLayout(lengths, c.cu_q)
            w = Workload("peer", lengths, causal=c.causal, heads_q=q.shape[1], heads_kv=k.shape[1],
                         head_dim=q.shape[2])
            self._built[key] = _CudnnGraphs(
                layout, forward_graph(layout, w, io_type, fp8=self.fp8, stats=self.with_backward),
                backward_graph(layout, w, io_type, fp8=self.fp8) if self.with_backward else None,
                Fp8Scales(q.device) if self.fp8 else None)
        return self._built[key]

    def lse(self, stats: torch.Tensor, c: _Call, q: torch.Tensor) -> torch.Tensor:
        """The forward's stats [B, Hq, S, 1] -> lse [Hq, Tq]."""
        return packed_lse(stats[..., 0], c.cu_q, c.max_q, q, f"cudnn:{'fp8' if self.fp8 else 'bf16'} stats")


class _CudnnBf16(_Cudnn):
    """BF16 sdpa / sdpa_backward; O and the gradients in bf16."""

    def forward(self, q, k, v, c: _Call):
        g = self.graphs(q, k, c)
        out = forward_outputs(g.layout, q, q.dtype, stats=True)
        g.forward(q=q, k=k, v=v, **out)
        return out["o"], self.lse(out["stats"], c, q), (q, k, v, out["o"], out["stats"])

    def backward(self, saved, do, c: _Call):
        q, k, v, o, stats = saved
        grads = grad_outputs(q, k, v, q.dtype)
        self.graphs(q, k, c).backward(q=q, k=k, v=v, o=o, dO=do, stats=stats, **grads)
        return tuple(grads[name] for name in GRADS)


class _CudnnFp8(_Cudnn):
    """FP8 sdpa_fp8 / sdpa_fp8_backward with ``Fp8Scales`` calibrated on each graph's first
    call (the module doc); O and the gradients dequantized to fp32. Without a backward the
    forward writes no stats and the callable returns no lse."""

    fp8 = True

    def forward(self, q, k, v, c: _Call):
        g = self.graphs(q, k, c)

        def run():
            out = forward_outputs(g.layout, q, FP8, stats=self.with_backward)
            return out, fp8_forward(g.forward, g.scales, q, k, v, out)

        if "forward" not in g.calibrated:  # the graph's first call: O's scale from a unit-scale run
            run()
            g.scales.calibrate_forward()
            g.calibrated.add("forward")
        out, state = run()
        o = g.scales.dequantize(out["o"], "scale_o")
        if not self.with_backward:
            return o, None, ()
        saved = (*(state[name] for name in FP8_STATE), out["o"], out["stats"])
        return o, self.lse(out["stats"], c, q), saved

    def backward(self, saved, do, c: _Call):
        if not self.with_backward:
            raise RuntimeError("cudnn:fp8: built forward only for this workload; its backward needs dense "
                               "equal lengths and d=128 on Hopper")
        *codes, o, stats = saved
        state = dict(zip(FP8_STATE, codes))
        g = self.graphs(state["q"], state["k"], c)

        def run():
            grads = grad_outputs(state["q"], state["k"], state["v"], FP8)
            fp8_backward(g.backward, g.scales, state, do, {"o": o, "stats": stats, **grads})
            return grads

        if "backward" not in g.calibrated:  # the first backward: dQ's, dK's, dV's, dP's scales
            run()
            g.scales.calibrate_backward()
            g.calibrated.add("backward")
        grads = run()
        return tuple(g.scales.dequantize(grads[name], f"scale_{name}") for name in GRADS)


class _Fa4:
    """flash_attn.cute.flash_attn_varlen_func, differentiable through its own autograd;
    it returns lse when the installed version takes ``return_lse``."""

    def __init__(self):
        from flash_attn.cute import flash_attn_varlen_func

        self.__name__, self._attention = "fa4:bf16", flash_attn_varlen_func
        takes_lse = "return_lse" in inspect.signature(flash_attn_varlen_func).parameters
        self._lse_kwargs = {"return_lse": True} if takes_lse else {}

    def __call__(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal):
        result = self._attention(q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                                 max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, causal=causal,
                                 **self._lse_kwargs)
        out, lse = result if isinstance(result, tuple) else (result, None)
        if lse is not None:
            lse = packed_lse(lse, cu_seqlens_q, max_seqlen_q, q, "fa4:bf16 (flash_attn.cute)")
        return out, lse


class _PerDocuments:
    """An attention callable named ``name`` over a peer built once per set of documents:
    ``build(q, k, call) -> attention(q, k, v) -> (out, lse or None)``, kept for the
    (lengths, heads, head dim, mask, device) it was built for (the probe's calls share it)."""

    def __init__(self, name: str, build: Callable):
        self.__name__, self._build, self._built = name, build, {}

    def __call__(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal):
        call = _Call(cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), bool(causal))
        key = (tuple(cu_seqlens_q.tolist()), tuple(cu_seqlens_k.tolist()), q.shape[1], k.shape[1], q.shape[2],
               call.causal, q.device)
        if key not in self._built:
            self._built[key] = self._build(q, k, call)
        return self._built[key](q, k, v)


def _flex(q, k, c: _Call):
    if not torch.equal(c.cu_q, c.cu_k):
        raise ValueError("cu_seqlens_k: the FlexAttention peer attends each document to itself; it must equal "
                         "cu_seqlens_q")
    lengths = tuple(torch.diff(c.cu_q).tolist())
    return flex_document_attention(c.cu_q, q.shape[0], c.causal, q.shape[1] != k.shape[1],
                                   f"peer {lengths} {tuple(q.shape)} {tuple(k.shape)} {c.causal}", with_lse=True)


def _flashinfer(fp8: bool):
    def build(q, k, c: _Call):
        run = flashinfer_prefill(c.cu_q, c.cu_k, q.shape[1], k.shape[1], q.shape[2], c.causal, fp8, q.dtype)
        return lambda q, k, v: (run(q, k, v), None)
    return build


# key -> (whether the backward runs on the workload) -> attention callable
_BUILDERS: dict[str, Callable[[bool], Attention]] = {
    "fa2:bf16": lambda with_backward: _StagedAttention("fa2:bf16", _Fa2()),
    "flex:bf16": lambda with_backward: _PerDocuments("flex:bf16", _flex),
    "flashinfer:bf16": lambda with_backward: _PerDocuments("flashinfer:bf16", _flashinfer(fp8=False)),
    "flashinfer:fp8": lambda with_backward: _PerDocuments("flashinfer:fp8", _flashinfer(fp8=True)),
    "cudnn:bf16": lambda with_backward: _StagedAttention("cudnn:bf16", _CudnnBf16(with_backward)),
    "cudnn:fp8": lambda with_backward: _StagedAttention("cudnn:fp8", _CudnnFp8(with_backward)),
    "fa4:bf16": lambda with_backward: _Fa4(),
}
