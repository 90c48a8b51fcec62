"""Offline probe: the forward's tile loop with warp specialization in Gluon (Triton 3.6): a
1-warp producer partition fills a ring of K^ / V^T stages with cp.async and signals mbarriers;
the default 4-warp partition waits, runs S = Q^ K^T and O += P^ V^ as async FP8 wgmma, and
frees the stage. Compile-only: barrier counts and phases are not validated here."""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma, warpgroup_mma_wait, fence_async_shared
from triton.experimental.gluon.language.nvidia.hopper import mbarrier
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp


@gluon.jit
def _producer(k_s, v_s, ready, empty, p_k, p_vt, n_tiles, D: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr):
    LD: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [1, 1], [1, 0])
    rk = gl.arange(0, BN, layout=gl.SliceLayout(1, LD))
    rd = gl.arange(0, D, layout=gl.SliceLayout(1, LD))
    cd = gl.arange(0, D, layout=gl.SliceLayout(0, LD))
    cn = gl.arange(0, BN, layout=gl.SliceLayout(0, LD))
    for j in range(n_tiles):
        s = j % STAGES
        mbarrier.wait(empty.index(s), ((j // STAGES) & 1) ^ 1)
        cp.async_copy_global_to_shared(k_s.index(s), p_k + (j * BN + rk)[:, None] * D + cd[None, :])
        cp.async_copy_global_to_shared(v_s.index(s), p_vt + rd[:, None] * (n_tiles * BN) + (j * BN + cn)[None, :])
        cp.mbarrier_arrive(ready.index(s), increment_count=False)


@gluon.jit
def _consumer(q_s, k_s, v_s, ready, empty, p_o, n_tiles, D: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
              STAGES: gl.constexpr):
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 32])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 32])
    P_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=4)
    m = gl.full([BM], float("-inf"), gl.float32, layout=gl.SliceLayout(1, S_L))
    acc = gl.zeros([BM, D], gl.float32, layout=O_L)
    for j in range(n_tiles):
        s = j % STAGES
        mbarrier.wait(ready.index(s), (j // STAGES) & 1)
        fence_async_shared()
        sc = warpgroup_mma(q_s, k_s.index(s).permute((1, 0)), gl.zeros([BM, BN], gl.float32, layout=S_L),
                           use_acc=False, is_async=True)
        sc = warpgroup_mma_wait(0, deps=(sc,))
        m_new = gl.maximum(m, gl.max(sc, axis=1))
        alpha = gl.exp2(m - m_new)
        p8 = gl.convert_layout(gl.exp2(sc - m_new[:, None]).to(gl.float8e4nv), P_L)
        o = warpgroup_mma(p8, v_s.index(s).permute((1, 0)), gl.zeros([BM, D], gl.float32, layout=O_L),
                          use_acc=False, is_async=True)
        o = warpgroup_mma_wait(0, deps=(o,))
        mbarrier.arrive(empty.index(s), count=1)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_L))[:, None] + o
        m = m_new
    ro = gl.arange(0, BM, layout=gl.SliceLayout(1, O_L))
    co = gl.arange(0, D, layout=gl.SliceLayout(0, O_L))
    gl.store(p_o + ro[:, None] * D + co[None, :], acc)


@gluon.jit
def ws_probe(p_q, p_k, p_vt, p_o, n_tiles, D: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
             STAGES: gl.constexpr):
    LD: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0])
    q_s = gl.allocate_shared_memory(gl.float8e4nv, [BM, D], gl.NVMMASharedLayout.get_default_for([BM, D], gl.float8e4nv))
    k_s = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BN, D],
                                    gl.NVMMASharedLayout.get_default_for([BN, D], gl.float8e4nv))
    v_s = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, D, BN],
                                    gl.NVMMASharedLayout.get_default_for([D, BN], gl.float8e4nv))
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=32)
        mbarrier.init(empty.index(s), count=1)
    r = gl.arange(0, BM, layout=gl.SliceLayout(1, LD))
    cd = gl.arange(0, D, layout=gl.SliceLayout(0, LD))
    cp.async_copy_global_to_shared(q_s, p_q + r[:, None] * D + cd[None, :])
    cp.commit_group()
    cp.wait_group(0)
    gl.thread_barrier()
    # The default partition stores O itself: Triton 3.6 failed to flatten a tensor it returned.
    gl.warp_specialize([(_consumer, (q_s, k_s, v_s, ready, empty, p_o, n_tiles, D, BM, BN, STAGES)),
                        (_producer, (k_s, v_s, ready, empty, p_k, p_vt, n_tiles, D, BN, STAGES))],
                       [1], [40])
