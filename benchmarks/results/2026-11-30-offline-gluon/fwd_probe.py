"""Offline probe: one forward tile step in Gluon (S = Q^ K^T FP8 wgmma, exp2, P^ fp8 as the A
operand of O = P^ V^), cp.async loads into NVMMA shared layouts, async wgmma + waits."""
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma, warpgroup_mma_wait, fence_async_shared
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp


@gluon.jit
def fwd_probe(p_q, p_k, p_vt, p_o, n_tiles, D: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr):
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 32])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 32])
    P_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=4)
    LD: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0])  # 16-byte loads
    q_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, D], gl.float8e4nv)
    k_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, D], gl.float8e4nv)
    v_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([D, BN], gl.float8e4nv)
    q_s = gl.allocate_shared_memory(gl.float8e4nv, [BM, D], q_sl)
    k_s = gl.allocate_shared_memory(gl.float8e4nv, [BN, D], k_sl)
    v_s = gl.allocate_shared_memory(gl.float8e4nv, [D, BN], v_sl)
    r = gl.arange(0, BM, layout=gl.SliceLayout(1, LD))
    rk = gl.arange(0, BN, layout=gl.SliceLayout(1, LD))
    rd = gl.arange(0, D, layout=gl.SliceLayout(1, LD))
    cd = gl.arange(0, D, layout=gl.SliceLayout(0, LD))
    cn = gl.arange(0, BN, layout=gl.SliceLayout(0, LD))
    cp.async_copy_global_to_shared(q_s, p_q + r[:, None] * D + cd[None, :])
    cp.commit_group()
    m = gl.full([BM], float("-inf"), gl.float32, layout=gl.SliceLayout(1, S_L))
    acc = gl.zeros([BM, D], gl.float32, layout=O_L)
    for j in range(n_tiles):
        cp.async_copy_global_to_shared(k_s, p_k + (j * BN + rk)[:, None] * D + cd[None, :])
        cp.async_copy_global_to_shared(v_s, p_vt + rd[:, None] * (n_tiles * BN) + (j * BN + cn)[None, :])
        cp.commit_group()
        cp.wait_group(0)
        fence_async_shared()
        s = warpgroup_mma(q_s, k_s.permute((1, 0)), gl.zeros([BM, BN], gl.float32, layout=S_L), use_acc=False,
                          is_async=True)
        s = warpgroup_mma_wait(0, deps=(s,))
        m_new = gl.maximum(m, gl.max(s, axis=1))
        alpha = gl.exp2(m - m_new)
        p = gl.exp2(s - m_new[:, None])
        p8 = gl.convert_layout(p.to(gl.float8e4nv), P_L)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_L))[:, None]
        acc = warpgroup_mma(p8, v_s.permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(acc,))
        m = m_new
    ro = gl.arange(0, BM, layout=gl.SliceLayout(1, O_L))
    co = gl.arange(0, D, layout=gl.SliceLayout(0, O_L))
    gl.store(p_o + ro[:, None] * D + co[None, :], acc)
