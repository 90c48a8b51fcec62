"""Per-shape launch programs: an eager training call's launches issued again without its Python.

The first eager forward (or backward) of a shape runs the ordinary path while ``record``
notes every launch (``launch.py``) and every aten op (a ``TorchDispatchMode``). If the path
ran no GPU work besides those launches (only allocations and views), ``Program.build``
turns the record into a program: per launch, the compiled kernel's launcher, the grid and the
argument values, each pointer (a tensor or a TMA descriptor's base) replaced by a slot:

- an input of the call (q, k, v, cu_seqlens; dO, O, the saved workspace),
- an output it returns (out, lse; dq, dk, dv), allocated per call as the ordinary path does,
- or a place in one of two buffers allocated per call: the workspace, which holds the
  allocations the backward reads (the forward's residuals) and is saved for it, and the
  scratch, which holds the rest and is freed when the call returns.

Later calls of the shape allocate the outputs and the two buffers, fill the slots and call
each launcher directly: a few microseconds per launch instead of the ordinary path's tens.
Descriptors are rebuilt only for base addresses not seen before (the caching allocator hands
a steady training loop the same few). The launchers are called the way Triton 3.6 or 3.9
calls them (``_CONVENTION``); with another Triton, a launch hook (profilers) or the
interpreter, every call takes the ordinary path.
"""
import collections
import contextlib
import types
from dataclasses import dataclass

import torch
import triton
from torch.utils._python_dispatch import TorchDispatchMode
from triton import knobs

from . import launch as _launch
from .fp8 import interpreting

aten = torch.ops.aten
_ALLOCATIONS = {aten.empty.memory_format, aten.empty_like.default, aten.new_empty.default,
                aten.empty_strided.default, aten.new_empty_strided.default}
_ALIGN = 256  # buffer pieces start where a fresh allocation's 16-byte specialization holds
_MAX_PROGRAMS = 256  # kept per direction (forward: per process; backward: per forward program)
# How a compiled kernel's C launch takes its arguments. Triton 3.6 (36): a launcher per kernel,
# launch(x, y, z, stream, function, cooperative, pdl, global scratch, profile scratch,
# metadata, launch metadata, enter hook, exit hook, *kernel args). Triton 3.9 (39): one launch
# for all kernels, launch(x, y, z, stream, function, cooperative, pdl, metadata, launch
# metadata, enter hook, exit hook, global scratch, profile scratch, argument annotations,
# kernel signature, kernel args as one tuple). None: another Triton, never replayed.
_CONVENTION = {"3.6": 36, "3.9": 39}.get(".".join(triton.__version__.split(".")[:2]))


def available() -> bool:
    """Whether calls may replay now: a Triton whose launch convention this module knows, no
    launch hook, not interpreting."""
    return (_CONVENTION is not None and not interpreting() and not _launch._hooked(knobs.runtime.launch_enter_hook)
            and not _launch._hooked(knobs.runtime.launch_exit_hook))


class _Ops(TorchDispatchMode):
    """Notes the tensors allocated and whether any aten op other than an allocation or a view ran."""

    def __init__(self):
        super().__init__()
        self.fresh: list[torch.Tensor] = []
        self.other: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if func in _ALLOCATIONS:
            self.fresh.append(result)
        elif not func.is_view:
            self.other.append(str(func))
        return result


@contextlib.contextmanager
def record(enabled: bool = True):
    """Runs the body's launches and aten ops under watch; yields (launches, ops), or
    (None, None) and watches nothing when not ``enabled``."""
    if not enabled:
        yield None, None
        return
    launches: list = []
    ops = _Ops()
    previous = getattr(_launch.recording, "launches", None)
    _launch.recording.launches = launches
    try:
        with ops:
            yield launches, ops
    finally:
        _launch.recording.launches = previous


@dataclass(frozen=True)
class _Region:
    """Where a slot's pointer lives: base ``index`` of a call's bases (inputs, then outputs,
    then the workspace and the scratch) plus ``offset`` bytes."""

    index: int
    offset: int


class _Locator:
    """Maps a device address of the recorded call to a _Region."""

    def __init__(self, spans: list[tuple[int, int, int, int]]):
        self.spans = spans  # (start, nbytes, base index, offset of start in that base)

    def find(self, ptr: int) -> _Region:
        for start, nbytes, index, offset in self.spans:
            if start <= ptr < start + max(nbytes, 1):
                return _Region(index, offset + ptr - start)
        raise LookupError(f"address {ptr:#x} is in no input, output or allocation of the call")


def _nbytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


class _Step:
    """One launch: its launcher and argument list, with the pointer slots and descriptor slots
    that each call fills."""

    __slots__ = ("fn", "args", "pointers", "descriptors")

    def __init__(self, fn, args: list, pointers: list, descriptors: list):
        self.fn, self.args, self.pointers, self.descriptors = fn, args, pointers, descriptors

    def __call__(self, bases: list, stream: int) -> None:
        args = self.args.copy()
        args[3] = stream
        for position, index, offset in self.pointers:
            args[position] = bases[index] + offset
        for position, index, offset, maps, make in self.descriptors:
            ptr = bases[index] + offset
            tensor_map = maps.get(ptr)
            if tensor_map is None:
                if len(maps) > 64:
                    maps.clear()
                tensor_map = maps[ptr] = make(ptr)
            args[position] = tensor_map
        self.fn(*args)


class _Base:
    """What Triton's descriptor expansion reads of a descriptor's base tensor: its address."""

    __slots__ = ("ptr",)

    def __init__(self, ptr: int):
        self.ptr = ptr

    def data_ptr(self) -> int:
        return self.ptr


def _descriptor_maker(desc, meta):
    """ptr -> the CUtensorMap of ``desc`` with its base at ptr (Triton's own expansion, which
    takes one more, unused, argument from 3.9 on)."""
    from triton.backends.nvidia.driver import make_tensordesc_arg

    shim = types.SimpleNamespace(shape=list(desc.shape), strides=list(desc.strides), padding=desc.padding,
                                 round_f32_to_tf32=getattr(desc, "round_f32_to_tf32", False))
    extra = (None,) if _CONVENTION == 39 else ()

    def make(ptr: int):
        shim.base = _Base(ptr)
        return make_tensordesc_arg(shim, meta, *extra)[0]

    return make


def _launch_head(compiled, grid: tuple, descriptors: bool) -> tuple:
    """(C launch, the arguments before the kernel's own) of a compiled kernel in this Triton's
    ``_CONVENTION``, the stream at position 3 (filled per call); ``descriptors``: the kernel
    takes TMA descriptors, which the C launch under Triton's expanding wrapper takes expanded.
    Under 3.9 the launch takes the kernel's arguments as one tuple, so the returned one packs
    them."""
    run = compiled.run
    fn = _closure(run.launch).get("launcher") if descriptors else run.launch
    if fn is None:
        raise LookupError("an unexpected descriptor launcher")
    grid = tuple(grid) + (1,) * (3 - len(grid))
    common = [*grid, 0, compiled.function, run.launch_cooperative_grid, run.launch_pdl]
    if _CONVENTION != 39:
        return fn, common + [None, None, compiled.packed_metadata, None, None, None]
    if getattr(run, "gsan_enabled", False):
        raise LookupError("a kernel built with the global sanitizer")
    head = common + [compiled.packed_metadata, None, None, None, None, None, run.arg_annotations,
                     run.kernel_signature]
    n = len(head)
    return (lambda *args: fn(*args[:n], args[n:])), head


def _closure(fn) -> dict:
    return dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__ or ())))


def _step(compiled, grid: tuple, values: tuple, locate: _Locator) -> _Step:
    """The _Step of one recorded launch (``_launch_head``'s convention, descriptors expanded)."""
    meta = compiled.metadata
    if meta.global_scratch_size or meta.profile_scratch_size:
        raise LookupError("a kernel with global scratch memory")
    signature = list(compiled.src.signature.values())
    descriptor_meta = list(getattr(meta, "tensordesc_meta", None) or [])
    described = any(isinstance(s, str) and s.startswith("tensordesc") for s in signature)
    if described and (not descriptor_meta or None in descriptor_meta):
        raise LookupError("an unexpected descriptor launcher")
    fn, args = _launch_head(compiled, grid, described)
    pointers, descriptors = [], []
    for value, kind in zip(values, signature):
        if isinstance(kind, str) and kind.startswith("tensordesc"):
            region = locate.find(value.base.data_ptr())
            make = _descriptor_maker(value, descriptor_meta.pop(0))
            descriptors.append((len(args), region.index, region.offset, {}, make))
            args += [None, *value.shape, *value.strides]
        elif isinstance(value, torch.Tensor):
            region = locate.find(value.data_ptr())
            pointers.append((len(args), region.index, region.offset))
            args.append(None)
        else:
            args.append(value)
    return _Step(fn, args, pointers, descriptors)


def _pack(tensors: list[torch.Tensor]) -> tuple[dict, int]:
    """Byte offsets of the distinct allocations among tensors in one buffer, and its size."""
    offsets, size = {}, 0
    for t in tensors:
        if t.data_ptr() not in offsets:
            offsets[t.data_ptr()] = size
            size += -(-_nbytes(t) // _ALIGN) * _ALIGN
    return offsets, size


class Program:
    """The launches of one recorded call, replayable on new inputs of the same shape.

    outputs: (shape, dtype) of each tensor the call returns; kept: (shape, stride, dtype, offset)
    of each residual the backward reads, in the workspace (``views`` rebuilds them)."""

    def __init__(self, steps: list[_Step], outputs: list, workspace: int, scratch: int, kept: list):
        self.steps, self.outputs, self.workspace, self.scratch, self.kept = steps, outputs, workspace, scratch, kept
        self.backward = Programs()  # a forward program's backward programs, by dO's layout

    @classmethod
    def build(cls, launches: list, ops: _Ops, inputs: list, outputs: list, kept: list) -> "Program":
        """From a ``record`` of a call that read ``inputs`` and returned ``outputs`` (fresh
        allocations) and ``kept`` (views of fresh allocations the backward reads). LookupError
        when the call is not replayable."""
        if ops.other:
            raise LookupError(f"the call ran {ops.other[0]}")
        if any(entry is None for entry in launches):
            raise LookupError("a launch outside launch.py's keyed path")
        live = [t for t in ops.fresh if _nbytes(t)]
        out_ptrs = [t.data_ptr() for t in outputs]
        for t in outputs:
            if not t.is_contiguous() or not any(t.data_ptr() == f.data_ptr() and _nbytes(t) == _nbytes(f)
                                                for f in live):
                raise LookupError("an output that is not a whole fresh allocation")
        kept_allocs = {f.data_ptr() for f in live for k in kept
                       if f.data_ptr() <= k.data_ptr() < f.data_ptr() + _nbytes(f)}
        rest = [f for f in live if f.data_ptr() not in out_ptrs]
        ws_offsets, ws_size = _pack([f for f in rest if f.data_ptr() in kept_allocs])
        tmp_offsets, tmp_size = _pack([f for f in rest if f.data_ptr() not in kept_allocs])
        n_in, n_out = len(inputs), len(outputs)
        # an input's own extent (inputs are contiguous: the ordinary path would have copied one
        # that is not), not its storage's, which views of one buffer share
        spans = [(t.data_ptr(), t.numel() * t.element_size(), i, 0) for i, t in enumerate(inputs)]
        spans += [(t.data_ptr(), _nbytes(t), n_in + j, 0) for j, t in enumerate(outputs)]
        for f in rest:
            ptr = f.data_ptr()
            if ptr in ws_offsets:
                spans.append((ptr, _nbytes(f), n_in + n_out, ws_offsets[ptr]))
            else:
                spans.append((ptr, _nbytes(f), n_in + n_out + 1, tmp_offsets[ptr]))
        ranges = sorted((s, s + n) for s, n, _, _ in spans if n)
        if any(a_end > b_start for (_, a_end), (b_start, _) in zip(ranges, ranges[1:])):
            raise LookupError("inputs that overlap each other or an allocation")
        locate = _Locator(spans)
        steps = [_step(compiled, grid, values, locate) for compiled, grid, values in launches]
        kept_views = []
        for k in kept:
            region = locate.find(k.data_ptr())
            if region.index != n_in + n_out:
                raise LookupError("a residual outside the workspace")
            kept_views.append((tuple(k.shape), k.stride(), k.dtype, region.offset))
        return cls(steps, [(tuple(t.shape), t.dtype) for t in outputs], ws_size, tmp_size, kept_views)

    @classmethod
    def try_build(cls, *record) -> "Program | None":
        """``build``, or None for a call that is not replayable."""
        try:
            return cls.build(*record)
        except LookupError:
            return None

    def __call__(self, inputs: list, device: torch.device) -> tuple[list, torch.Tensor | None]:
        """(the outputs, the workspace or None when it is empty) for inputs laid out as the
        recorded call's."""
        outputs = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in self.outputs]
        workspace = torch.empty(self.workspace, dtype=torch.uint8, device=device) if self.workspace else None
        scratch = torch.empty(self.scratch, dtype=torch.uint8, device=device) if self.scratch else None
        bases = [t.data_ptr() for t in inputs] + [t.data_ptr() for t in outputs]
        bases += [0 if workspace is None else workspace.data_ptr(), 0 if scratch is None else scratch.data_ptr()]
        stream = _launch._stream(_launch._device())
        for step in self.steps:
            step(bases, stream)
        return outputs, workspace

    def views(self, workspace: torch.Tensor) -> list[torch.Tensor]:
        """The residuals as views of a workspace this program filled."""
        views = []
        for shape, stride, dtype, offset in self.kept:
            view = torch.empty(0, dtype=dtype, device=workspace.device)
            views.append(view.set_(workspace.untyped_storage(), offset // view.element_size(), shape, stride))
        return views


class Programs:
    """Programs by call key, least recently used first; a key maps to None when its call is
    not replayable. Past ``_MAX_PROGRAMS`` keys the least recently used one is dropped, so a
    run whose shapes drift keeps replaying the recent ones."""

    def __init__(self):
        self.table: collections.OrderedDict = collections.OrderedDict()

    def get(self, key):
        """The Program, None (not replayable) or ... (not recorded yet)."""
        found = self.table.get(key, ...)
        if found is not ...:
            self.table.move_to_end(key)
        return found

    def put(self, key, program: "Program | None") -> None:
        self.table[key] = program
        if len(self.table) > _MAX_PROGRAMS:
            self.table.popitem(last=False)
