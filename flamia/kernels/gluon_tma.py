"""TMA plumbing shared by the Gluon attention kernels (``attn_fwd_gluon.py``, ``attn_dq_gluon.py``,
``attn_dkdv_gluon.py``): the load's and the CTA barrier's names across Triton versions, the warps
of one warpgroup, the copy slots' mbarriers, host descriptors of code tensors (E4M3 or BF16), the
wgmma layouts of an operand format, and the zeroing of copied rows past a document."""
import functools

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from .configs import format_of

# Triton 3.6 names the TMA load async_copy_global_to_shared; later versions (the offline
# SASS test may run one) call it async_load.
tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
# A CTA-wide barrier (bar.sync): thread_barrier in Triton 3.6, barrier later. Kernels call this
# name, not either of Triton's, so that they compile on both.
cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
WARPS = gl.constexpr(4)  # one warpgroup, 16 rows per warp: AttnTiles checks 64-row tiles


@functools.lru_cache(maxsize=None)
def code_layout(block: tuple, codes):
    """The NVMMA shared layout a wgmma operand ``block`` of codes (gl.float8e4nv or
    gl.bfloat16) needs: built once per block, as constructing it costs more host time than
    the launch that uses it."""
    return gl.NVMMASharedLayout.get_default_for(list(block), codes)


_fields: dict = {}  # (dtype, block, layout) -> a validated descriptor's fields but the tensor's own


def descriptor(x, block: tuple, layout) -> TensorDescriptor:
    """``TensorDescriptor.from_tensor(x, list(block), layout)`` for a 2-D view x, at a fraction
    of its host time: Triton validates each (dtype, block, layout) once, and what depends on
    x itself (a 16-byte aligned base and row stride, contiguous rows, no empty axis) is
    checked here; a view that fails those goes through Triton's checks, which raise. Its
    ``launch_key`` stands for (dtype, block, layout) in ``launch.py``'s keys, which would
    otherwise hash the layout on every launch."""
    key = (x.dtype, block, layout)
    fields = _fields.get(key)
    rows, cols = x.shape
    if (fields is None or x.data_ptr() & 15 or (x.stride(0) * x.element_size()) & 15 or x.stride(1) != 1
            or not rows or not cols):
        desc = TensorDescriptor.from_tensor(x, list(block), layout)
        if fields is None:
            fields = {k: v for k, v in vars(desc).items() if k not in ("base", "shape", "strides")}
            _fields[key] = dict(fields, launch_key=("descriptor", len(_fields)))
        desc.launch_key = _fields[key]["launch_key"]
        return desc
    desc = object.__new__(TensorDescriptor)
    vars(desc).update(fields, base=x, shape=x.shape, strides=x.stride())
    return desc


def code_descriptors(*views):
    """Host TMA descriptors of 2-D code views (float8_e4m3fn or bfloat16), each given as
    (tensor, block shape), with the NVMMA shared layout a wgmma operand of that block needs.
    Rows and columns past a view's end read zeros."""
    return tuple(descriptor(x, tuple(block), code_layout(tuple(block), format_of(x).codes)) for x, block in views)


@gluon.constexpr_function
def mma_layout(N, CODES):
    """The accumulator layout of a one-warpgroup wgmma [64, N] on operands of format CODES:
    the instruction's k is 32 bytes, 32 E4M3 or 16 BF16 elements (Triton's choice for these
    tiles, so the Gluon kernels run the Triton kernels' instructions)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                     instr_shape=[16, N, 256 // CODES.primitive_bitwidth])


@gluon.constexpr_function
def register_a_layout(parent, CODES):
    """The register A operand of a wgmma whose accumulator is ``parent``: each thread holds 32
    bits of k per row, 4 E4M3 or 2 BF16 elements."""
    return gl.DotOperandLayout(operand_index=0, parent=parent, k_width=32 // CODES.primitive_bitwidth)



@gluon.jit
def relayout(x, LAYOUT: gl.constexpr):
    """x in LAYOUT where that names the same registers: a row vector reduced from a tile, a
    tile regrouped and back, or an accumulator of another operand format (an accumulator's
    registers do not depend on its operands'). The shared math's TO_ROWS / TO_LAYOUT."""
    return gl.convert_layout(x, LAYOUT, assert_trivial=True)


@gluon.jit
def copy_barriers(N: gl.constexpr):
    """N mbarriers ([N, 1] in shared memory), each completing when its TMA copies' bytes
    have landed (one arrival: the expect), made visible to the async proxy before any copy."""
    bars = gl.allocate_shared_memory(gl.int64, [N, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(N):
        mbarrier.init(bars.index(i), count=1)
    fence_async_shared()
    return bars


@gluon.jit
def wait_copy(bars, n, STAGES: gl.constexpr):
    """Wait for the n-th copy group of a ring of STAGES slots (slot n % STAGES, its
    (n // STAGES)-th completion)."""
    mbarrier.wait(bars.index(n % STAGES), (n // STAGES) & 1)


@gluon.jit
def zero_rows_from(x_s, first):
    """Zero rows first.. of x_s [R, D] (row codes in shared memory) before a wgmma reads them:
    a product over tokens must not read the next document's codes that a tile past a
    document's end copied, where a zero P or G times a non-finite code would carry it across
    documents; the transposed codes hold zeros there."""
    L: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [WARPS, 1], [1, 0])
    b_x = x_s.load(L)                                                # [R, D]
    rows = gl.arange(0, x_s.shape[0], layout=gl.SliceLayout(1, L))
    x_s.store(gl.where((rows < first)[:, None], b_x, gl.zeros_like(b_x)))
    fence_async_shared()
    cta_barrier()
