"""The direct launch path's key (flamia/kernels/launch.py): two calls share a kept compiled
kernel only if Triton would specialize them alike."""
import torch

import itertools

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
