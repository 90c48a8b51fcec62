"""TMA plumbing shared by the Gluon attention kernels (``attn_fwd_gluon.py``, ``attn_dq_gluon.py``):
the load's name across Triton versions, the warps of one warpgroup, the copy slots' mbarriers,
and host descriptors of FP8 code tensors."""
import functools

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

# Triton 3.6 names the TMA load async_copy_global_to_shared; later versions (the offline
# SASS test may run one) call it async_load.
tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
WARPS = gl.constexpr(4)  # one warpgroup, 16 rows per warp: AttnTiles checks 64-row tiles


@functools.lru_cache(maxsize=None)
def fp8_layout(block: tuple):
    """The NVMMA shared layout a wgmma operand of an FP8 ``block`` needs: built once per
    block, as constructing it costs more host time than the launch that uses it."""
    return gl.NVMMASharedLayout.get_default_for(list(block), gl.float8e4nv)


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


def fp8_descriptors(*views):
    """Host TMA descriptors of 2-D float8_e4m3fn views, each given as (tensor, block shape),
    with the NVMMA shared layout a wgmma operand of that block needs. Rows and columns past
    a view's end read zeros."""
    return tuple(descriptor(x, tuple(block), fp8_layout(tuple(block))) for x, block in views)


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
