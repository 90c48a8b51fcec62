"""Kernel launches without Triton's per-call argument processing (docs/PERFORMANCE.md, host time).

``kernel[grid](...)`` binds and specializes every argument, builds a cache key string and
checks the kernel's globals on each call: tens of microseconds of Python per launch. ``launch``
makes the first launch of each specialization that way, keeps the ``CompiledKernel`` it
returns, and from then on calls its launcher directly. The key holds everything Triton
specializes on, so a kept kernel is reused only where Triton would pick the same one:
constexpr values, launch options, each tensor's dtype and 16-byte alignment, each int's
class (1, a multiple of 16, 32- or 64-bit; only the width for an int in the kernel's
``do_not_specialize``), a tensor descriptor's dtype, block and layout, and the device.
Under TRITON_INTERPRET, with a launch hook installed (profilers), or for an argument it
cannot classify, it takes ``kernel[grid]`` every time.

Triton 3.6 to 3.9 call a compiled kernel's launcher the same way
(``CompiledKernel.run(grid0, grid1, grid2, stream, function, packed_metadata,
launch_metadata, enter_hook, exit_hook, *all arguments in signature order)``); this module is
the one place that relies on it.
"""
import functools
import operator
import threading

import torch
from triton import knobs
from triton.runtime.driver import driver

from .fp8 import interpreting

_MAX_KEYS = 512  # kept specializations; past this, new ones launch the ordinary way
# Runtime ints that follow the packing of a call (document count, work-list widths and their
# offsets in the plan's buffer, a per-call seed). Every kernel names them in
# ``do_not_specialize``: otherwise a training run, whose batches hold a different number of
# documents each step, compiles a kernel again whenever one of them changes class.
PACKING_INTS = ("num_docs", "steps", "width", "width2", "seed", "o_qop", "o_kop", "o_fwd", "o_go", "o_dkdv",
                "o_dq", "w_qop", "w_kop", "w_fwd", "w_go", "w_dkdv", "w_dq")
# The launch options flamia passes (``launch`` sets enable_fp_fusion; sass_offline.py compiles with them).
LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg", "enable_fp_fusion")
# Every launch asks for contracted multiply-adds, with which the kernels are tuned and checked:
# Triton 3.10 compiles without them unless asked, and 3.9 warns in each process that does not ask.
FP_FUSION = True
_kept: dict = {}
# replay.record's list of this thread's launches, (compiled, grid, values) each, None where unkeyable
recording = threading.local()
_bindings: dict = {}  # (id(kernel), positional count) -> _Binding


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) of host ints: ``triton.cdiv`` is a constexpr function in later Tritons,
    whose host calls cost microseconds."""
    return -(-a // b)


def _device() -> int:
    return torch.cuda.current_device()


def _stream(device: int) -> int:
    return driver.active.get_current_stream(device)


def _int_width(x: int) -> str:
    """The int type Triton passes x as: "i32", "i64" or "u64"."""
    return "i32" if -0x80000000 <= x <= 0x7FFFFFFF else "u64" if x >= 0x8000000000000000 else "i64"


def _class(x):
    """What Triton specializes a runtime argument on; TypeError if unknown. Ints: 1, or a
    32-bit, 64-bit or unsigned 64-bit int, multiple of 16 or not (names, never bools, which
    would equal 1 in a key)."""
    kind = type(x)
    if kind is torch.Tensor:
        return x.dtype, not x.data_ptr() & 15
    if kind is int:
        width = _int_width(x)
        if x == 1 or width == "u64":
            return "one" if x == 1 else width
        return width if x & 15 else width + "/16"
    if kind is float:
        return float
    if isinstance(x, torch.Tensor):
        return x.dtype, not x.data_ptr() & 15
    if x is None or kind is bool:
        return x
    token = getattr(x, "launch_key", None)
    if token is not None:  # a descriptor from gluon_tma.descriptor: its (dtype, block, layout)
        return token
    base = getattr(x, "base", None)
    if isinstance(base, torch.Tensor):  # a host tensor descriptor
        return base.dtype, tuple(x.block_shape), x.layout, x.padding, getattr(x, "round_f32_to_tf32", False)
    raise TypeError(f"no launch key for a {kind.__name__}")


def _hooked(hook) -> bool:
    """A launch hook is installed: a non-empty HookChain, or a plain callable."""
    return hook is not None and bool(getattr(hook, "calls", True))


def _picker(indices: list):
    """values -> the tuple of values[i] for i in indices."""
    if len(indices) == 1:
        return lambda values: (values[indices[0]],)
    return operator.itemgetter(*indices) if indices else lambda values: ()


def loose_params(kernel) -> set:
    """Indices of the kernel's parameters in its ``do_not_specialize`` (given by index or name)."""
    names = set(getattr(kernel, "do_not_specialize", ()) or ())
    return {i for i, p in enumerate(kernel.params) if i in names or p.name in names}


def _width_class(x):
    """What Triton specializes an int in ``do_not_specialize`` on: its width alone."""
    return _int_width(x) if type(x) is int else _class(x)


class _Binding:
    """How to read the arguments of a kernel called with ``positional`` positional ones:
    the names of the rest in signature order, and pickers of the runtime values (specialized
    and not) and of the constexpr values."""

    def __init__(self, kernel, positional: int):
        params = kernel.params
        loose = loose_params(kernel)
        self.count = len(params)
        self.keywords = tuple(p.name for p in params[positional:])
        self.runtime = _picker([i for i, p in enumerate(params) if not p.is_constexpr and i not in loose])
        self.loose = _picker([i for i, p in enumerate(params) if not p.is_constexpr and i in loose])
        self.constexpr = _picker([i for i, p in enumerate(params) if p.is_constexpr])


class _Kinds:
    """Pickers of the tensors, the ints and the other arguments (descriptors, bools; floats
    and None need nothing but their type) among runtime values of one tuple of types."""

    def __init__(self, types: tuple):
        tensor = [issubclass(t, torch.Tensor) for t in types]
        self.tensors = _picker([i for i, t in enumerate(tensor) if t])
        self.ints = _picker([i for i, t in enumerate(types) if t is int])
        self.rest = _picker([i for i, t in enumerate(types)
                             if not tensor[i] and t not in (int, float, type(None))])


_kinds: dict = {}
_dtype = operator.attrgetter("dtype")
_one = (1).__eq__
_low_bits = (15).__and__


def _runtime_key(values: tuple) -> tuple:
    """``tuple(map(_class, values))`` in effect, with the common cases mapped by C functions:
    the types; the tensors' dtypes and whether all are 16-byte aligned (else which are); the
    ints' equality to 1 and divisibility by 16 (a 64-bit int takes ``_class``'s path); the
    rest through ``_class``."""
    types = tuple(map(type, values))
    kinds = _kinds.get(types)
    if kinds is None:
        kinds = _kinds[types] = _Kinds(types)
    tensors, ints = kinds.tensors(values), kinds.ints(values)
    pointers = tuple(map(torch.Tensor.data_ptr, tensors))
    aligned = not functools.reduce(operator.or_, pointers, 0) & 15 or tuple(not p & 15 for p in pointers)
    if ints and (min(ints) < -0x80000000 or max(ints) > 0x7FFFFFFF):
        int_key = tuple(map(_class, ints))
    else:
        int_key = tuple(map(_one, ints)), tuple(map(operator.not_, map(_low_bits, ints)))
    return types, tuple(map(_dtype, tensors)), aligned, int_key, tuple(map(_class, kinds.rest(values)))


def launch_key(kernel, args: tuple, kwargs: dict) -> tuple[tuple, tuple]:
    """(the key of the compiled kernel this call needs, every argument value in signature
    order); KeyError or TypeError for a call this path cannot key."""
    binding = _bindings.get((id(kernel), len(args)))
    if binding is None:
        binding = _bindings[id(kernel), len(args)] = _Binding(kernel, len(args))
    if len(args) + len(kwargs) != binding.count + sum(map(kwargs.__contains__, LAUNCH_OPTIONS)):
        raise KeyError("an option outside LAUNCH_OPTIONS, or a parameter left to its default")
    values = args + tuple(map(kwargs.__getitem__, binding.keywords))
    key = (id(kernel), _device(), _runtime_key(binding.runtime(values)),
           tuple(map(_width_class, binding.loose(values))), binding.constexpr(values),
           tuple(map(kwargs.get, LAUNCH_OPTIONS)))
    return key, values


def launch(kernel, grid: tuple, *args, **kwargs) -> None:
    """``kernel[grid](*args, **kwargs)``, through the kept compiled kernel when there is one.
    Every kernel parameter after the positional ones is given by keyword (no defaults);
    launch options among ``LAUNCH_OPTIONS``, with ``enable_fp_fusion`` set to ``FP_FUSION``."""
    kwargs["enable_fp_fusion"] = FP_FUSION
    if interpreting() or _hooked(knobs.runtime.launch_enter_hook) or _hooked(knobs.runtime.launch_exit_hook):
        kernel[grid](*args, **kwargs)
        _note(None)
        return
    try:
        key, values = launch_key(kernel, args, kwargs)
        compiled = _kept.get(key)
    except (KeyError, TypeError):  # not a call this path can key
        kernel[grid](*args, **kwargs)
        _note(None)
        return
    if compiled is None:
        compiled = kernel[grid](*args, **kwargs)
        if getattr(compiled, "function", None) is not None and len(_kept) < _MAX_KEYS:
            _kept[key] = compiled
    else:
        compiled.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1, _stream(key[1]),
                     compiled.function, compiled.packed_metadata, None, None, None, *values)
    _note((compiled, grid, values))


def _note(entry) -> None:
    """Append a launch to this thread's ``recording``, if one is on: (compiled, grid, values),
    or None for a launch that took ``kernel[grid]`` (replay.py cannot replay it)."""
    record = getattr(recording, "launches", None)
    if record is not None:
        record.append(entry)
