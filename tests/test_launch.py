"""The direct launch path's key (flamia/kernels/launch.py): two calls share a kept compiled
kernel only if Triton would specialize them alike."""
import itertools

import pytest
import torch

from flamia.kernels.launch import _class, _hooked, _runtime_key


def test_int_classes_follow_triton_specialization():
    classes = {v: _class(v) for v in (1, 2, 16, 17, 32, 2 ** 31, -16)}
    assert classes[1] != classes[2] != classes[16]
    assert classes[16] == classes[32] != classes[17]
    assert classes[2 ** 31] != classes[32]  # int64, not int32
    assert classes[2] == classes[17]


def test_tensor_class_is_dtype_and_alignment():
    x = torch.zeros(64, dtype=torch.float32)
    assert _class(x) == _class(torch.zeros(8, dtype=torch.float32))
    assert _class(x) != _class(x.to(torch.int32))
    assert _class(x[1:]) != _class(x)  # 4 bytes off a 16-byte boundary


def test_runtime_key_separates_what_class_separates():
    """Two argument tuples share a key exactly when their ``_class``es agree."""
    x = torch.zeros(64, dtype=torch.float32)
    samples = [x, x[1:], x.to(torch.int32), 1, 2, 16, 32, 17, -16, 2 ** 31, 2 ** 40 + 16, 0.5, None, True, False]
    pairs = list(itertools.product(samples, repeat=2))
    for a, b in itertools.product(pairs, repeat=2):
        same_class = tuple(map(_class, a)) == tuple(map(_class, b))
        assert (_runtime_key(a) == _runtime_key(b)) == same_class, (a, b)


def test_scalars_and_unknowns():
    assert _class(0.5) == _class(2.0)
    assert _class(None) is None and _class(True) is True
    try:
        _class("text")
    except TypeError:
        pass
    else:
        raise AssertionError("an unknown argument must fall back to the ordinary launch")


def test_hooks():
    from triton import knobs
    assert not _hooked(None)
    assert _hooked(print)
    assert _hooked(knobs.runtime.launch_enter_hook) == bool(getattr(knobs.runtime.launch_enter_hook, "calls", True))


def test_every_launch_asks_for_contracted_multiply_adds(monkeypatch):
    """The kernels are tuned and checked with FMA contraction, which Triton 3.10 leaves off
    unless a launch asks for it: launch() asks on every path."""
    from flamia.kernels import launch as launch_module

    seen = []

    class Kernel:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: seen.append((grid, args, kwargs))

    monkeypatch.setattr(launch_module, "interpreting", lambda: True)
    launch_module.launch(Kernel(), (3,), 7, BLOCK=16, num_warps=4)
    assert seen == [((3,), (7,), {"BLOCK": 16, "num_warps": 4, "enable_fp_fusion": True})]


def test_descriptor_equals_tritons():
    """gluon_tma.descriptor builds the fields TensorDescriptor.from_tensor builds, and sends a
    view it cannot vouch for through Triton's checks."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from flamia.kernels.gluon_tma import code_layout, descriptor

    for shape in [(100, 2048), (3, 4096), (100, 2048)]:
        x = torch.zeros(shape, dtype=torch.float8_e4m3fn)
        got = descriptor(x, (64, 128), code_layout((64, 128), gl.float8e4nv))
        want = TensorDescriptor.from_tensor(x, [64, 128], code_layout((64, 128), gl.float8e4nv))
        assert type(got) is TensorDescriptor and vars(got).keys() - vars(want).keys() == {"launch_key"}
        assert all(getattr(got, k) is x if k == "base" else getattr(got, k) == v for k, v in vars(want).items())
    try:
        descriptor(torch.zeros(100, 2048, dtype=torch.float8_e4m3fn)[:, 1:], (64, 128),
                   code_layout((64, 128), gl.float8e4nv))
    except AssertionError:
        pass
    else:
        raise AssertionError("a misaligned view must fail Triton's check")


def _record_launches(monkeypatch) -> list:
    """Every flamia.kernels module's ``launch`` appends (kernel, args, kwargs) to the returned
    list instead of running the kernel: nothing on the host reads a launch's output."""
    import importlib
    import pkgutil

    import flamia.kernels
    from flamia.kernels import launch as launch_module

    calls, original = [], launch_module.launch
    for info in pkgutil.iter_modules(flamia.kernels.__path__):
        module = importlib.import_module(f"flamia.kernels.{info.name}")
        if module is not launch_module and getattr(module, "launch", None) is original:
            monkeypatch.setattr(module, "launch", lambda kernel, grid, *a, **kw: calls.append((kernel, a, kw)))
    return calls


def test_packing_changes_no_kernel_specialization(monkeypatch):
    """A training run's batches hold a different number of documents each step. Every launch of
    a training call needs the same compiled kernel for every packing of the same tokens (and
    every seed), so no step compiles a kernel again: the key that launch.py keeps kernels
    under, and which Triton's own specialization follows, is the same launch by launch."""
    import triton

    from flamia.kernels import launch as launch_module
    from flamia.kernels import ops as kernel_ops
    from flamia.recipes import RECIPES
    from flamia.spec import AttnSpec

    monkeypatch.setattr(launch_module, "_device", lambda: 0)
    calls = _record_launches(monkeypatch)
    twins = {}

    def jit(kernel):  # the interpreter's kernels lack the parameter list: a JITFunction twin
        if hasattr(kernel, "params"):
            return kernel
        if id(kernel) not in twins:
            twins[id(kernel)] = triton.JITFunction(kernel.fn, do_not_specialize=kernel.kwargs["do_not_specialize"])
        return twins[id(kernel)]

    heads, head_dim = 2, 64
    packings = [(256,), (100, 156), (16,) * 16, (1,) * 17 + (239,), (37, 1, 70, 148), (8,) * 32, (8,) * 32 + (0,)]
    for recipe in ("mxfp8", "nvfp4", "bf16", "fp4"):
        keys = []
        for n, lengths in enumerate(packings):
            cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
            q, k, v, do = (torch.randn(sum(lengths), heads, head_dim, dtype=torch.bfloat16) for _ in range(4))
            spec = AttnSpec(cu, cu, max(lengths), max(lengths), True, head_dim ** -0.5, (-1, -1), RECIPES[recipe],
                            seed=8 * n + 1)
            calls.clear()
            out, _, res = kernel_ops.forward(q, k, v, spec)
            kernel_ops.backward(do, out, res, spec)
            keys.append([(kernel.fn.__name__, launch_module.launch_key(jit(kernel), args, kwargs)[0])
                         for kernel, args, kwargs in calls])
        # bf16 Q and K are the bf16 route's own codes: no Q and K launch; fp4's stochastic G
        # adds its rows' random-word parts
        assert len(keys[0]) == {"bf16": 7, "fp4": 9}.get(recipe, 8), \
            f"{recipe}: plan, Q and K, V, PV, forward; dO, (G's row parts), dK/dV, dQ"
        for lengths, got in zip(packings[1:], keys[1:]):
            assert [name for name, _ in got] == [name for name, _ in keys[0]], recipe
            for (name, want), (_, key) in zip(keys[0], got):
                assert key == want, f"{recipe}: {name} specializes anew on documents {lengths}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("recipe", ["mxfp8", "nvfp4", "bf16", "fp4"])
def test_new_packings_compile_nothing_on_the_gpu(recipe):
    """Training calls through the API on packings of the same tokens into 1 to 33 documents:
    after the first packing no launch needs a kernel not yet kept (the Gluon kernels too)."""
    import flamia
    from flamia.kernels import launch as launch_module

    packings = [(4096,), (1000, 3096), (256,) * 16, (1,) * 17 + (4079,), (128,) * 32, (128,) * 32 + (0,)]
    kept = []
    for lengths in packings:
        cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device="cuda")
        q, k, v = (torch.randn(4096, 4, 128, dtype=torch.bfloat16, device="cuda", requires_grad=True)
                   for _ in range(3))
        out = flamia.flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), causal=True, recipe=recipe)
        out.backward(torch.randn_like(out))
        kept.append(len(launch_module._kept))
    assert kept[1:] == kept[:1] * (len(packings) - 1), f"kernels kept after each packing: {kept}"
