"""Kernel launches without Triton's per-call argument processing (docs/PERFORMANCE.md, host time).

``kernel[grid](...)`` binds and specializes every argument, builds a cache key string and
checks the kernel's globals on each call: tens of microseconds of Python per launch. ``launch``
makes the first launch of each specialization that way, keeps the ``CompiledKernel`` it
returns, and from then on calls its launcher directly. The key holds everything Triton
specializes on, so a kept kernel is reused only where Triton would pick the same one:
constexpr values, launch options, each tensor's dtype and 16-byte alignment, each int's
class (1, a multiple of 16, 32- or 64-bit), a tensor descriptor's dtype, block and layout,
and the device. Under TRITON_INTERPRET, with a launch hook installed (profilers), or for an
argument it cannot classify, it takes ``kernel[grid]`` every time.

Triton 3.6 to 3.9 call a compiled kernel's launcher the same way
(``CompiledKernel.run(grid0, grid1, grid2, stream, function, packed_metadata,
launch_metadata, enter_hook, exit_hook, *all arguments in signature order)``); this module is
the one place that relies on it.
"""
import torch
from triton import knobs
from triton.runtime.driver import driver

from .fp8 import interpreting

_MAX_KEYS = 512  # kept specializations; past this, new ones launch the ordinary way
_kept: dict = {}
_plans: dict = {}  # id(kernel) -> (((name, is_constexpr), ...) in signature order, parameter names)
_INT32 = range(-2 ** 31, 2 ** 31)
_U64 = 2 ** 63


def _device() -> int:
    return torch.cuda.current_device()


def _stream(device: int) -> int:
    return driver.active.get_current_stream(device)


def _class(x):
    """What Triton specializes a runtime argument on; TypeError if unknown."""
    if isinstance(x, torch.Tensor):
        return x.dtype, x.data_ptr() % 16 == 0
    kind = type(x)
    if kind is int:
        return x == 1, x % 16 == 0, x in _INT32, x >= _U64
    if kind is float:
        return float
    if x is None or kind is bool:
        return x
    base = getattr(x, "base", None)
    if isinstance(base, torch.Tensor):  # a host tensor descriptor
        return base.dtype, tuple(x.block_shape), x.layout, x.padding
    raise TypeError(f"no launch key for a {kind.__name__}")


def _hooked(hook) -> bool:
    """A launch hook is installed: a non-empty HookChain, or a plain callable."""
    return hook is not None and bool(getattr(hook, "calls", True))


def _plan(kernel) -> tuple:
    plan = _plans.get(id(kernel))
    if plan is None:
        params = tuple((p.name, p.is_constexpr) for p in kernel.params)
        plan = _plans[id(kernel)] = params, frozenset(name for name, _ in params)
    return plan


def launch(kernel, grid: tuple, *args, **kwargs) -> None:
    """``kernel[grid](*args, **kwargs)``, through the kept compiled kernel when there is one.
    Every kernel parameter after the positional ones is given by keyword (no defaults)."""
    if interpreting() or _hooked(knobs.runtime.launch_enter_hook) or _hooked(knobs.runtime.launch_exit_hook):
        kernel[grid](*args, **kwargs)
        return
    params, names = _plan(kernel)
    try:
        values = args + tuple(kwargs[name] for name, _ in params[len(args):])
        device = _device()
        key = (id(kernel), device, tuple(v if const else _class(v) for v, (_, const) in zip(values, params)),
               tuple((k, v) for k, v in kwargs.items() if k not in names))  # launch options
        compiled = _kept.get(key)
    except (KeyError, TypeError):  # a parameter left to its default, or an argument without a key
        kernel[grid](*args, **kwargs)
        return
    if compiled is None:
        compiled = kernel[grid](*args, **kwargs)
        if getattr(compiled, "function", None) is not None and len(_kept) < _MAX_KEYS:
            _kept[key] = compiled
        return
    compiled.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1, _stream(device),
                 compiled.function, compiled.packed_metadata, None, None, None, *values)
