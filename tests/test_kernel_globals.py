"""Every global value a kernel function reads is one the GPU compiler accepts: a
``tl.constexpr``, a jitted function or another callable, a module, a class or a dtype. A plain
int or float global runs under the interpreter and fails only when Triton compiles for the GPU
("Cannot access global variable"), so the CPU suite checks the names here."""
import importlib
import pkgutil
import types

import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

import flamia.kernels

_KERNELS = (JITFunction, InterpretedFunction)  # what triton.jit and gluon.jit return, compiled or interpreted
_ALLOWED = (tl.constexpr, *_KERNELS, types.ModuleType, type, tl.dtype)


def _kernel_functions():
    for info in pkgutil.iter_modules(flamia.kernels.__path__):
        module = importlib.import_module(f"flamia.kernels.{info.name}")
        for name, value in vars(module).items():
            if isinstance(value, _KERNELS) and value.fn.__module__ == module.__name__:
                yield f"{module.__name__}.{name}", value.fn


def _plain_globals(fn) -> list[str]:
    """The globals fn's code reads that are plain values (callables are Triton's builtins and
    constexpr functions)."""
    return [name for name in fn.__code__.co_names if name in fn.__globals__
            and not isinstance(fn.__globals__[name], _ALLOWED) and not callable(fn.__globals__[name])]


def test_kernels_read_only_globals_the_compiler_accepts():
    found = list(_kernel_functions())
    assert len(found) > 40, "the scan found too few kernel functions to mean anything"
    bad = [f"{where}: {name}" for where, fn in found for name in _plain_globals(fn)]
    assert not bad, f"kernel functions read plain globals: {bad}"


def test_the_check_sees_a_plain_global():
    module = types.ModuleType("probe")
    exec("import triton.language as tl\nLIMIT = 16\nSTEP = tl.constexpr(2)\n"
         "def f(x):\n    return tl.abs(x) + LIMIT * STEP\n", module.__dict__)
    assert _plain_globals(module.f) == ["LIMIT"]
