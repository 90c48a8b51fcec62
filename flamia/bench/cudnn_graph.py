"""Plumbing of the cuDNN frontend peers (``import cudnn``, nvidia-cudnn-frontend): packed
tensors declared to a graph, the graph built, and run on the current stream.

cuDNN sees packed rows [T, H, D] as [B, H, S, D] with strides [S*H*D, D, H*D, 1] (S the
longest document). When every document has S tokens that is exactly the dense BSHD layout;
otherwise each tensor carries ragged offsets (the element offset of each document's first
row, int64 [B + 1, 1, 1, 1]) and the graph a padding mask from the lengths (THD layout).
Softmax stats stay dense: fp32 [B, H, S, 1].
"""
import math
from dataclasses import dataclass

import torch

from ..workload import PackedInputs

_HANDLES: dict[int, object] = {}


def cudnn_module():
    """The frontend, imported on first use so that this module imports without it."""
    import cudnn
    return cudnn


def _handle():
    device = torch.cuda.current_device()
    if device not in _HANDLES:
        _HANDLES[device] = cudnn_module().create_handle()
    return _HANDLES[device]


@dataclass(frozen=True)
class PackedLayout:
    lengths: tuple[int, ...]
    cu_seqlens: torch.Tensor  # int32 [B + 1], on the GPU

    @classmethod
    def of(cls, inputs: PackedInputs) -> "PackedLayout":
        return cls(inputs.lengths, inputs.cu_seqlens)

    @property
    def ragged(self) -> bool:
        return len(set(self.lengths)) > 1

    @property
    def batch(self) -> int:
        return len(self.lengths)

    @property
    def seq(self) -> int:
        return max(self.lengths)

    def dims(self, heads: int, head_dim: int) -> list[int]:
        return [self.batch, heads, self.seq, head_dim]

    def strides(self, heads: int, head_dim: int) -> list[int]:
        return [self.seq * heads * head_dim, head_dim, heads * head_dim, 1]

    def new_stats(self, heads: int) -> torch.Tensor:
        return torch.empty(self.batch, heads, self.seq, 1, dtype=torch.float32, device=self.cu_seqlens.device)


class Graph:
    """A built cuDNN graph with its workspace. Call it with device tensors by the names
    they were declared under; constants bound at build time (offsets, lengths) come along."""

    def __init__(self, graph, named: dict, constants: dict):
        self._graph, self._named, self._constants = graph, named, constants
        self._workspace = torch.empty(graph.get_workspace_size(), dtype=torch.uint8, device="cuda")

    def __call__(self, **tensors: torch.Tensor) -> None:
        pack = dict(self._constants)
        pack.update({self._named[name]: t for name, t in tensors.items()})
        handle = _handle()
        # The current stream, which is the capturing one while a CUDA graph is recorded.
        cudnn_module().set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
        self._graph.execute(pack, self._workspace, handle=handle)


class GraphBuilder:
    """A cuDNN graph under construction over ``layout``; ``io_type`` is the cudnn data type
    of Q, K, V, O and their gradients. ``graph`` is the frontend's pygraph: add the
    attention node to it directly, declaring its tensors through the methods here."""

    def __init__(self, layout: PackedLayout, io_type):
        cudnn = cudnn_module()
        self.layout = layout
        self.graph = cudnn.pygraph(io_data_type=io_type, intermediate_data_type=cudnn.data_type.FLOAT,
                                   compute_data_type=cudnn.data_type.FLOAT, handle=_handle())
        self._named, self._constants, self._offsets = {}, {}, {}

    def _constant(self, name: str, value: torch.Tensor, data_type):
        tensor = self.graph.tensor(name=name, dim=list(value.shape), stride=list(value.stride()),
                                   data_type=data_type)
        self._constants[tensor] = value
        return tensor

    def _set_ragged(self, tensor, heads: int, head_dim: int) -> None:
        if not self.layout.ragged:
            return
        width = heads * head_dim
        if width not in self._offsets:
            offsets = (self.layout.cu_seqlens.long() * width).reshape(-1, 1, 1, 1)
            int64 = cudnn_module().data_type.INT64
            self._offsets[width] = self._constant(f"ragged_offset_{width}", offsets, int64)
        tensor.set_ragged_offset(self._offsets[width])

    def packed(self, name: str, heads: int, head_dim: int, data_type):
        """An input [T, heads, head_dim] packed tensor."""
        tensor = self.graph.tensor(name=name, dim=self.layout.dims(heads, head_dim),
                                   stride=self.layout.strides(heads, head_dim), data_type=data_type)
        self._set_ragged(tensor, heads, head_dim)
        self._named[name] = tensor
        return tensor

    def scalar(self, name: str):
        """An fp32 input of one element (a scale or descale)."""
        tensor = self.graph.tensor(name=name, dim=[1, 1, 1, 1], stride=[1, 1, 1, 1],
                                   data_type=cudnn_module().data_type.FLOAT)
        self._named[name] = tensor
        return tensor

    def stats(self, name: str, heads: int):
        """An fp32 softmax-stats input [B, heads, S, 1]."""
        tensor = self.graph.tensor(name=name, dim=self._stats_dims(heads), stride=self._stats_strides(heads),
                                   data_type=cudnn_module().data_type.FLOAT)
        self._named[name] = tensor
        return tensor

    def _stats_dims(self, heads: int) -> list[int]:
        return [self.layout.batch, heads, self.layout.seq, 1]

    def _stats_strides(self, heads: int) -> list[int]:
        return [heads * self.layout.seq, self.layout.seq, 1, 1]

    def packed_output(self, name: str, tensor, heads: int, head_dim: int, data_type) -> None:
        tensor.set_output(True).set_dim(self.layout.dims(heads, head_dim)).set_stride(
            self.layout.strides(heads, head_dim)).set_data_type(data_type)
        self._set_ragged(tensor, heads, head_dim)
        self._named[name] = tensor

    def stats_output(self, name: str, tensor, heads: int) -> None:
        tensor.set_output(True).set_dim(self._stats_dims(heads)).set_stride(
            self._stats_strides(heads)).set_data_type(cudnn_module().data_type.FLOAT)
        self._named[name] = tensor

    def scalar_output(self, name: str, tensor) -> None:
        tensor.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(
            cudnn_module().data_type.FLOAT)
        self._named[name] = tensor

    def masking(self, causal: bool, head_dim: int, backward: bool = False) -> dict:
        """Keyword arguments of the sdpa nodes: scale, causal mask, and for ragged layouts
        the padding mask (plus, for the backward, the workspace bound on total tokens)."""
        kwargs = dict(attn_scale=1.0 / math.sqrt(head_dim), use_causal_mask=causal)
        if not self.layout.ragged:
            return kwargs
        int32 = cudnn_module().data_type.INT32
        lengths = torch.diff(self.layout.cu_seqlens).reshape(-1, 1, 1, 1)
        kwargs.update(use_padding_mask=True, seq_len_q=self._constant("seq_len_q", lengths, int32),
                      seq_len_kv=self._constant("seq_len_kv", lengths, int32))
        if backward:
            bound = -(-sum(self.layout.lengths) // 64) * 64  # total tokens, rounded up to 64
            kwargs.update(max_total_seq_len_q=bound, max_total_seq_len_kv=bound)
        return kwargs

    def build(self) -> Graph:
        cudnn = cudnn_module()
        self.graph.validate()
        self.graph.build_operation_graph()
        self.graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        self.graph.check_support()
        self.graph.build_plans()
        return Graph(self.graph, self._named, self._constants)
