"""Per-shape launch programs (flamia/kernels/replay.py): what a recorded call may contain on
the CPU, and on the GPU the replayed eager training call against the ordinary one, bit for
bit, on packed documents of odd lengths with GQA, both head dims, masks and recipes."""
import re
from pathlib import Path

import pytest
import torch

import flamia
from flamia.kernels import ops as kernel_ops
from flamia.kernels import replay
from flamia.workload import make_packed_inputs

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
CONVENTION = replay._CONVENTION  # the installed Triton's, which the GPU tests switch off and on


def test_record_sees_allocations_and_flags_other_work():
    with replay.record() as (launches, ops):
        x = torch.empty((4, 8), dtype=torch.float32)
        x.view(8, 4)[1:].flatten()
        y = torch.empty_like(x)
    assert launches == [] and ops.other == []
    assert [t.data_ptr() for t in ops.fresh] == [x.data_ptr(), y.data_ptr()]
    with replay.record() as (_, ops):
        torch.zeros(3)
    assert ops.other, "a fill is GPU work a replay would skip"


def test_record_collects_this_threads_launches_only():
    """launch.py appends to the list of the thread that records: another thread's launches,
    and those after the record, go nowhere."""
    import threading

    from flamia.kernels import launch as launch_module
    seen = []
    with replay.record() as (launches, _):
        assert launch_module.recording.launches is launches
        other = threading.Thread(target=lambda: seen.append(getattr(launch_module.recording, "launches", None)))
        other.start()
        other.join()
    assert seen == [None] and getattr(launch_module.recording, "launches", None) is None


def test_every_kernel_launch_goes_through_launch_py():
    """A program holds the launches that ``launch.launch`` recorded: a kernel called as
    ``kernel[grid](...)`` elsewhere would be left out of its replays, silently."""
    root = Path(__file__).resolve().parents[1] / "flamia" / "kernels"
    direct = [f"{path.name}:{n}" for path in sorted(root.glob("*.py")) if path.name != "launch.py"
              for n, line in enumerate(path.read_text().splitlines(), 1) if re.search(r"\w\[grid\]\(", line)]
    assert not direct, f"launches outside launch.launch: {direct}"


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["mxfp8", "nvfp4", "fp4", "bf16"])
def test_a_training_call_takes_eight_launches(recipe):
    """plan, Q and K, V, PV, forward; dO, dK/dV, dQ: each launch is host time an eager call pays
    (test_kernel_ops.py counts the interpreter's). The bf16 route reads bf16 Q and K as they
    are: no Q and K launch. fp4's stochastic G adds one, its rows' random-word parts
    (``random_bits.grad_row_parts``)."""
    from flamia.recipes import RECIPES
    from flamia.spec import AttnSpec
    inputs = make_packed_inputs((37, 1, 70), 4, 2, 64, seed=3, device="cuda")
    spec = AttnSpec(inputs.cu_seqlens, inputs.cu_seqlens, 70, 70, True, 0.125, (-1, -1), RECIPES[recipe])
    with replay.record() as (forward, _):
        out, _, res = kernel_ops.forward(inputs.q, inputs.k, inputs.v, spec)
    with replay.record() as (backward, _):
        kernel_ops.backward(inputs.do, out, res, spec)
    assert (len(forward), len(backward)) == (4 if recipe == "bf16" else 5, 4 if recipe == "fp4" else 3)


def test_build_refuses_what_it_cannot_replay():
    with replay.record() as (launches, ops):
        out = torch.empty(16)
        out.add_(1)
    with pytest.raises(LookupError, match="ran"):
        replay.Program.build(launches, ops, [], [out], [])
    q = torch.empty(16)
    with replay.record() as (launches, ops):
        torch.empty(4)
    with pytest.raises(LookupError, match="output"):
        replay.Program.build(launches, ops, [q], [q], [])  # an input returned as an output
    with replay.record() as (launches, ops):
        launches.append(None)  # what launch.py appends for a launch it could not key
    with pytest.raises(LookupError, match="launch"):
        replay.Program.build(launches, ops, [], [], [])


class _FakeCompiled:
    """What ``replay._step`` reads of a CompiledKernel (Triton 3.6's or 3.9's), with a launcher
    that notes its arguments: signature (p_in, p_out, p_tmp, p_res, n, BLOCK), no descriptor."""

    def __init__(self):
        self.calls = []
        self.function, self.packed_metadata = 7, (4, 1, 0)
        self.src = type("Src", (), {"signature": {"p_in": "*fp32", "p_out": "*fp32", "p_tmp": "*fp32",
                                                  "p_res": "*i32", "n": "i32", "BLOCK": "constexpr"}})()
        self.metadata = type("Meta", (), {"global_scratch_size": 0, "profile_scratch_size": 0,
                                          "tensordesc_meta": None})()
        launcher = type("Launcher", (), {"launch_cooperative_grid": False, "launch_pdl": False,
                                         "arg_annotations": "annotations", "kernel_signature": "signature"})()
        launcher.launch = lambda *args: self.calls.append(args)
        self.run = launcher


def _unpack(args: tuple, convention: int) -> tuple:
    """(grid, stream, function, metadata, the kernel's arguments) of one C launch's arguments in
    ``replay._CONVENTION`` ``convention``; under 3.9 the annotations and the signature too."""
    if convention == 39:
        assert args[13:15] == ("annotations", "signature") and len(args) == 16
        return args[:3], args[3], args[4], args[7], tuple(args[15])
    return args[:3], args[3], args[4], args[9], args[13:]


@pytest.mark.parametrize("convention", [36, 39])
def test_program_maps_every_pointer_to_its_slot(monkeypatch, convention):
    """A recorded call's pointers become slots: an input at its offset, an output, a piece of
    the workspace (what the backward reads) or of the scratch; replayed on new tensors, each
    launch gets the new addresses, and the residuals come back as views of the workspace."""
    monkeypatch.setattr(replay, "_CONVENTION", convention)
    monkeypatch.setattr(replay._launch, "_device", lambda: 0)
    monkeypatch.setattr(replay._launch, "_stream", lambda device: 99)
    kernel = _FakeCompiled()
    x = torch.arange(64, dtype=torch.float32)
    with replay.record() as (launches, ops):
        out = torch.empty(64)
        tmp = torch.empty((8, 8))
        res = torch.empty(40, dtype=torch.int32)
        launches.append((kernel, (4, 2), (x[16:], out, tmp[1], res[8:], 48, 16)))
    program = replay.Program.build(launches, ops, [x], [out], [res[8:].view(4, 8)])
    assert program.scratch >= tmp.numel() * 4 and program.workspace >= res.numel() * 4

    y = torch.arange(64, dtype=torch.float32) + 1
    (new_out,), workspace = program([y], y.device)
    (args,) = kernel.calls
    grid, stream, function, metadata, base = _unpack(args, convention)
    assert grid == (4, 2, 1) and stream == 99 and function == 7 and metadata == (4, 1, 0)
    assert base[0] == y.data_ptr() + 16 * 4 and base[1] == new_out.data_ptr()
    assert base[3] == workspace.data_ptr() + 8 * 4 and base[4:] == (48, 16)
    assert new_out.shape == out.shape and new_out.dtype == out.dtype and new_out.data_ptr() != out.data_ptr()
    assert not workspace.data_ptr() <= base[2] < workspace.data_ptr() + program.workspace  # scratch
    (view,) = program.views(workspace)
    assert view.shape == (4, 8) and view.dtype == torch.int32 and view.data_ptr() == base[3]


@pytest.mark.parametrize("convention", [36, 39])
def test_descriptors_are_rebuilt_per_new_base_only(monkeypatch, convention):
    """A TMA descriptor argument expands to (tensor map, shape, strides); the map is made again
    only for a base address the step has not seen."""
    monkeypatch.setattr(replay, "_CONVENTION", convention)
    monkeypatch.setattr(replay._launch, "_device", lambda: 0)
    monkeypatch.setattr(replay._launch, "_stream", lambda device: 0)
    made = []
    monkeypatch.setattr(replay, "_descriptor_maker",
                        lambda desc, meta: lambda ptr: made.append(ptr) or ("map", ptr))
    kernel = _FakeCompiled()
    calls = kernel.calls
    kernel.src.signature = {"x_desc": "tensordesc<fp8e4nv[64, 128]>", "n": "i32"}
    kernel.metadata.tensordesc_meta = [{"swizzle": 3}]

    def launcher(*args):
        calls.append(args)

    monkeypatch.setattr(replay, "_closure", lambda fn: {"launcher": launcher})
    x = torch.zeros((256, 128), dtype=torch.uint8)
    desc = type("Desc", (), {"base": x[64:], "shape": [192, 128], "strides": [128, 1], "padding": "zero"})()
    with replay.record() as (launches, ops):
        launches.append((kernel, (3,), (desc, 5)))
    program = replay.Program.build(launches, ops, [x], [], [])
    y = torch.zeros_like(x)
    for inputs in ([y], [y], [x]):
        program(inputs, y.device)
    assert [_unpack(args, convention)[4] for args in calls] == [
        (("map", y.data_ptr() + 64 * 128), 192, 128, 128, 1, 5)] * 2 + [
        (("map", x.data_ptr() + 64 * 128), 192, 128, 128, 1, 5)]
    assert made == [y.data_ptr() + 64 * 128, x.data_ptr() + 64 * 128]


@pytest.mark.parametrize("convention", [36, 39])
def test_descriptor_maker_calls_the_installed_tritons_expansion(monkeypatch, convention):
    """``_descriptor_maker`` hands Triton's ``make_tensordesc_arg`` a stand-in descriptor at the
    new base, with 3.9's extra argument, and keeps the tensor map it returns first."""
    from triton.backends.nvidia import driver
    seen = []
    monkeypatch.setattr(driver, "make_tensordesc_arg",
                        lambda arg, meta, *extra: seen.append((arg.base.data_ptr(), arg.shape, arg.strides, meta,
                                                               extra)) or ["map", *arg.shape, *arg.strides])
    monkeypatch.setattr(replay, "_CONVENTION", convention)
    desc = type("Desc", (), {"shape": [192, 128], "strides": [128, 1], "padding": "zero"})()
    make = replay._descriptor_maker(desc, {"swizzle": 3})
    assert make(4096) == "map"
    assert seen == [(4096, [192, 128], [128, 1], {"swizzle": 3}, (None,) if convention == 39 else ())]


def test_pack_aligns_each_allocation():
    a, b = torch.empty(3, dtype=torch.uint8), torch.empty(1000, dtype=torch.float32)
    offsets, size = replay._pack([a, b, a])
    assert offsets == {a.data_ptr(): 0, b.data_ptr(): replay._ALIGN}
    assert size % replay._ALIGN == 0 and size >= replay._ALIGN + 4000


def test_programs_table_keeps_the_recent_ones(monkeypatch):
    monkeypatch.setattr(replay, "_MAX_PROGRAMS", 2)
    table = replay.Programs()
    assert table.get("a") is ...
    table.put("a", None)
    table.put("b", None)
    assert table.get("a") is None  # a is now the most recently used
    table.put("c", None)
    assert table.get("b") is ... and table.get("a") is None and table.get("c") is None


def _grads(inputs, recipe, causal, window, cu_k=None):
    q, k, v = (x.detach().clone().requires_grad_() for x in (inputs.q, inputs.k, inputs.v))
    cu_k = inputs.cu_seqlens if cu_k is None else cu_k
    out, lse = flamia.flash_attn_varlen_func(q, k, v, inputs.cu_seqlens, cu_k, inputs.max_seqlen, inputs.max_seqlen,
                                             causal=causal, window_size=window, recipe=recipe, backend="triton",
                                             return_lse=True)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), inputs.do)
    return out, lse, dq, dk, dv


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["mxfp8", "bf16", "mxfp8-exact", "nvfp4"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("lengths,heads,causal,window,shared",
                         [((1000, 333, 1, 77), (8, 2), True, (-1, -1), True),
                          ((517, 0, 2048, 3), (16, 16), True, (128, 0), False),
                          ((999, 1, 64), (4, 4), False, (256, 256), True)],
                         ids=["gqa-causal", "window-unshared", "noncausal"])
def test_replay_matches_ordinary_bitwise(monkeypatch, recipe, head_dim, lengths, heads, causal, window, shared):
    """The recording call, then replays of forward and backward, against the ordinary path."""
    if recipe not in flamia.RECIPES or replay._CONVENTION is None:
        pytest.skip("needs the recipe and a Triton whose launch convention replay.py knows")
    inputs = make_packed_inputs(lengths, heads_q=heads[0], heads_kv=heads[1], head_dim=head_dim, device="cuda")
    cu_k = None if shared else inputs.cu_seqlens.clone()
    monkeypatch.setattr(kernel_ops, "_programs", replay.Programs())
    monkeypatch.setattr(replay, "_CONVENTION", None)
    want = _grads(inputs, recipe, causal, window, cu_k)
    monkeypatch.setattr(replay, "_CONVENTION", CONVENTION)
    for call in range(3):  # records, then replays (the first replayed backward records)
        got = _grads(inputs, recipe, causal, window, cu_k)
        for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), got, want):
            assert torch.equal(a, b), f"call {call}: {name} differs from the ordinary path"
    programs = [p for p in kernel_ops._programs.table.values() if p is not None]
    assert len(programs) == 1, "the call was not recorded as a program"
    assert [p for p in programs[0].backward.table.values() if p is not None], "the backward was not recorded"


@cuda
@pytest.mark.gpu
def test_unreplayable_calls_take_the_ordinary_path(monkeypatch):
    """Q, K, V as views of one fused QKV buffer are copied before the quantizers read whole rows
    (GPU work outside the launches): never a program, the same bits on every call."""
    if replay._CONVENTION is None:
        pytest.skip("needs a Triton whose launch convention replay.py knows")
    inputs = make_packed_inputs((300, 45), heads_q=4, heads_kv=4, head_dim=64, device="cuda")
    monkeypatch.setattr(kernel_ops, "_programs", replay.Programs())

    def fused_call():
        qkv = torch.stack([inputs.q, inputs.k, inputs.v], dim=1).requires_grad_()  # [T, 3, H, D]
        q, k, v = qkv.unbind(1)
        out, lse = flamia.flash_attn_varlen_func(q, k, v, inputs.cu_seqlens, inputs.cu_seqlens, inputs.max_seqlen,
                                                 inputs.max_seqlen, causal=True, backend="triton", return_lse=True)
        return out, lse, *torch.autograd.grad(out, qkv, inputs.do)

    first, second = fused_call(), fused_call()
    assert list(kernel_ops._programs.table.values()) == [None]
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@cuda
@pytest.mark.gpu
def test_replay_in_a_cuda_graph(monkeypatch):
    """A replayed training call captured in a CUDA graph gives the eager call's bits."""
    if replay._CONVENTION is None:
        pytest.skip("needs a Triton whose launch convention replay.py knows")
    inputs = make_packed_inputs((700, 300, 24), heads_q=8, heads_kv=4, head_dim=128, device="cuda")
    monkeypatch.setattr(kernel_ops, "_programs", replay.Programs())
    want = [_grads(inputs, "mxfp8", True, (-1, -1)) for _ in range(3)][-1]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            got = _grads(inputs, "mxfp8", True, (-1, -1))
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(got, want):
        assert torch.equal(a, b)


@cuda
@pytest.mark.gpu
def test_replay_on_views_of_one_buffer(monkeypatch):
    """q, k and v as contiguous views of one [3, T, H, D] leaf (a fused projection's output)
    record and replay like separate tensors."""
    if replay._CONVENTION is None:
        pytest.skip("needs a Triton whose launch convention replay.py knows")
    inputs = make_packed_inputs((400, 99, 7), heads_q=4, heads_kv=4, head_dim=128, device="cuda")

    def call():
        qkv = torch.stack((inputs.q, inputs.k, inputs.v)).requires_grad_()
        out = flamia.flash_attn_varlen_func(qkv[0], qkv[1], qkv[2], inputs.cu_seqlens, inputs.cu_seqlens,
                                            inputs.max_seqlen, inputs.max_seqlen, causal=True, backend="triton")
        return out, *torch.autograd.grad(out, qkv, inputs.do)

    monkeypatch.setattr(kernel_ops, "_programs", replay.Programs())
    monkeypatch.setattr(replay, "_CONVENTION", None)
    want = call()
    monkeypatch.setattr(replay, "_CONVENTION", CONVENTION)
    for _ in range(3):
        for a, b in zip(call(), want):
            assert torch.equal(a, b)
    assert [p for p in kernel_ops._programs.table.values() if p is not None], "views of one buffer were not recorded"


@cuda
@pytest.mark.gpu
def test_replay_with_other_lengths_of_the_same_shape(monkeypatch):
    """A program is keyed by shapes, not by cu_seqlens' values: documents of other lengths with
    the same total and count replay the recorded launches and still get the ordinary bits."""
    if replay._CONVENTION is None:
        pytest.skip("needs a Triton whose launch convention replay.py knows")
    first = make_packed_inputs((300, 45, 7), heads_q=8, heads_kv=2, head_dim=128, device="cuda")
    other = make_packed_inputs((100, 245, 7), heads_q=8, heads_kv=2, head_dim=128, seed=1, device="cuda")
    monkeypatch.setattr(kernel_ops, "_programs", replay.Programs())
    monkeypatch.setattr(replay, "_CONVENTION", None)
    want = _grads(other, "mxfp8", True, (-1, -1))
    monkeypatch.setattr(replay, "_CONVENTION", CONVENTION)
    for _ in range(2):
        _grads(first, "mxfp8", True, (-1, -1))  # records, then replays forward and records backward
    got = _grads(other, "mxfp8", True, (-1, -1))
    assert len([p for p in kernel_ops._programs.table.values() if p is not None]) == 1
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), got, want):
        assert torch.equal(a, b), name
