"""The forward of ``attn_fwd.py`` in Gluon (E4M3 or BF16 codes: ``CODES``), for Hopper: the next tile's scores run under
this tile's softmax.

Triton's ``tl.dot`` waits for each MMA where its result is first used, so the Triton forward
runs Q^ K^T, waits, runs the softmax, runs P^ V^, waits: the tensor cores idle through the
softmax unless another program on the SM fills them. Gluon (``triton.experimental.gluon``)
issues wgmma asynchronously and waits where the kernel says: here each step waits for its
own scores, issues the next tile's Q^ K^T, and runs its softmax and P^ V^ while that product
is in flight. One thread copies each K^ and V^T tile into NVMMA-swizzled shared memory with
TMA, STAGES - 1 tiles ahead of the scores that read them (no per-thread addresses), and the
key exponents come once per 32-key block (``records.block_key_records``): with a factor per
key, the next tile's scores do not fit in registers beside this tile's at 128-key tiles. The
next scores are issued once this tile's are read (scaled by the key factors), so their
product takes the registers this tile's scores held and the loop carries it without copying.

The program mapping (``program_geometry``), the tile body's arithmetic (``scores_to_codes``)
and the epilogue (``finish_rows``) are the Triton kernel's helpers (``fwd_math.py``), and the wgmma
instruction shapes are those Triton picks for the same tiles, so the outputs equal the
Triton kernel's bit for bit (the GPU tests check it). Gluon has no CPU interpreter: under
TRITON_INTERPRET the Triton kernel runs, and the CPU suite checks that one against the
emulator. The layouts name one warpgroup (4 warps, 64 query rows) per program.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                               warpgroup_mma_wait)

from .fp8 import e4m3_with_f16, pow2, pow2_reciprocal, scaled, to_output
from .fwd_math import diagonal_tile, finish_rows, program_geometry, query_factors, scores_to_codes, visible_keys
from .gluon_tma import (WARPS, code_descriptors, copy_barriers, mma_layout, register_a_layout, relayout, tma_load,
                        wait_copy)
from .launch import PACKING_INTS
from .layout import mma_token_order
from .records import UNIT_FACTORS, block_key_records, record_factors
from .worklist import program_tile

SUM_N = gl.constexpr(8)  # columns of the row sum's MMA, one per V scale block of a key tile (wgmma's least n)


@gluon.jit
def _copy_keys(k_desc, vt_desc, k_s, v_s, bars, slot, k_row, k_col, vt_row, vt_col):
    """Start the TMA copies of one key tile, K^ [BN, D] at (k_row, k_col) into k_s[slot] and
    V^T [D, BN] at (vt_row, vt_col) into v_s[slot], both completing bars[slot]. Rows and
    columns past a tensor's end read zeros; keys past the document are the next document's
    finite codes, whose P is zero (as in the Triton kernel's masked tiles)."""
    bar = bars.index(slot)
    mbarrier.expect(bar, k_desc.block_type.nbytes + vt_desc.block_type.nbytes)
    tma_load(k_desc, [k_row, k_col], bar, k_s.index(slot))
    tma_load(vt_desc, [vt_row, vt_col], bar, v_s.index(slot))


@gluon.jit
def _copy_key_tile(k_desc, vt_desc, vtd_desc, k_s, v_s, bars, slot, t, hk, k_start, k_start_t, diag_i0, len_q, len_k,
                   off, wl, wr, D: gl.constexpr, BN: gl.constexpr, DIAG_BM: gl.constexpr, DIAG_BN: gl.constexpr,
                   ALL4: gl.constexpr):
    """``_copy_keys`` of key tile t (head hk) into slot; with ALL4 a diagonal tile (from query
    row diag_i0, ``diagonal_tile``) copies V^T with per-key scales from vtd_desc instead."""
    k_row, vt_col = k_start + t * BN, k_start_t + t * BN
    if ALL4:
        if diagonal_tile(t * BN // DIAG_BN, diag_i0, len_q, len_k, off, wl, wr, DIAG_BM, DIAG_BN):
            _copy_keys(k_desc, vtd_desc, k_s, v_s, bars, slot, k_row, hk * D, hk * D, vt_col)
        else:
            _copy_keys(k_desc, vt_desc, k_s, v_s, bars, slot, k_row, hk * D, hk * D, vt_col)
    else:
        _copy_keys(k_desc, vt_desc, k_s, v_s, bars, slot, k_row, hk * D, hk * D, vt_col)


@gluon.jit
def _issue_scores(q_s, k_s, bars, j, BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, S_L: gl.constexpr):
    """Wait for key tile j's copies (slot j % STAGES) and start Q^ K^T [BM, BN] on them."""
    wait_copy(bars, j, STAGES)
    b_zero = gl.zeros([BM, BN], gl.float32, layout=S_L)
    return warpgroup_mma(q_s, k_s.index(j % STAGES).permute((1, 0)), b_zero, use_acc=False, is_async=True)


@gluon.jit
def _block_indicator(BN: gl.constexpr, SUM_BLOCK: gl.constexpr):
    """[SUM_N, BN] f16 in shared memory, 1 where key k lies in block c (k // SUM_BLOCK == c),
    else 0: the B operand (transposed) of the row sum's MMA. Visible to wgmma once fenced."""
    IND_L: gl.constexpr = gl.BlockedLayout([1, BN // 32], [1, 32], [WARPS, 1], [1, 0])
    o_c = gl.arange(0, SUM_N, layout=gl.SliceLayout(1, IND_L))
    o_k = gl.arange(0, BN, layout=gl.SliceLayout(0, IND_L))
    b_ind = gl.where(o_k[None, :] // SUM_BLOCK == o_c[:, None], 1.0, 0.0).to(gl.float16)  # [SUM_N, BN]
    ind_s = gl.allocate_shared_memory(gl.float16, [SUM_N, BN], gl.NVMMASharedLayout.get_default_for([SUM_N, BN],
                                                                                                     gl.float16), b_ind)
    fence_async_shared()
    return ind_s


@gluon.jit
def _block_vinv(p_krec_doc, k_lo, n_k, BN: gl.constexpr, SUM_BLOCK: gl.constexpr):
    """1 / vf [SUM_N] fp32 of the key tile's V scale blocks from key k_lo (a block's first
    key's word; 1 past the tile's blocks or the tensor), in the row sum's column layout."""
    o_c = gl.arange(0, SUM_N, layout=gl.SliceLayout(0, mma_layout(SUM_N, gl.float16)))
    k = k_lo + o_c * SUM_BLOCK
    rec = gl.load(p_krec_doc + k, mask=(o_c < BN // SUM_BLOCK) & (k < n_k), other=UNIT_FACTORS)
    return pow2_reciprocal(record_factors(rec)[1])


@gluon.constexpr_function
def _row_quads(layout):
    """An accumulator's linear layout with its registers reordered (the same registers, so a
    conversion moves nothing) so that each 4 consecutive ones hold one row's 4 columns of a
    16-column group, which ``e4m3_with_f16`` packs into one register: the FP8 register A
    operand's packing, where the accumulator's own order packs two rows' pairs."""
    regs = [list(b) for b in layout.reg_bases]
    second_row, second_pair = regs.index([8, 0]), regs.index([0, 8])
    regs[second_row], regs[second_pair] = regs[second_pair], regs[second_row]
    return gl.DistributedLinearLayout(regs, layout.lane_bases, layout.warp_bases, layout.block_bases, layout.shape)


@gluon.jit
def _mma_block_sums(b_pf, b_vf, SUMS_ARG, SUM_BLOCK: gl.constexpr, CODES: gl.constexpr, INTERPRET: gl.constexpr):
    """``attn_fwd.block_sums`` (its arguments and results, the sums [BM, SUM_N] with zeros
    past the tile's blocks) through one FP16 MMA: the codes' values as exact f16 pairs
    (``e4m3_with_f16``), already in the register A operand's layout, against the block
    indicator; the sums are exact (``block_sums``), so they are the CUDA cores' bit for bit,
    and the 64 conversions back to fp32, the 64 multiplies by 1 / vf and the add tree per
    thread and tile leave the CUDA cores. SUMS_ARG: (``_block_indicator``, ``_block_vinv``).
    The wait also waits for the next tile's scores, issued before: they ran under this
    tile's softmax."""
    ind_s, b_vinv = SUMS_ARG
    BM: gl.constexpr = b_pf.shape[0]
    BN: gl.constexpr = b_pf.shape[1]
    SUM_L: gl.constexpr = mma_layout(SUM_N, gl.float16)
    S_L: gl.constexpr = b_pf.type.layout
    PAIRS_L: gl.constexpr = _row_quads(gl.to_linear_layout(S_L, [BM, BN]))
    b_pq, b_p16 = e4m3_with_f16(gl.convert_layout(b_pf, PAIRS_L, assert_trivial=True))  # [BM, BN] codes, f16 values
    b_pq = gl.convert_layout(b_pq, S_L, assert_trivial=True)
    b_p16 = gl.convert_layout(b_p16, S_L, assert_trivial=True)
    b_a = gl.convert_layout(relayout(b_p16, mma_layout(BN, gl.float16)), register_a_layout(SUM_L, gl.float16),
                            assert_trivial=True)
    b_sums = warpgroup_mma(b_a, ind_s.permute((1, 0)), gl.zeros([BM, SUM_N], gl.float32, layout=SUM_L),
                           use_acc=False, is_async=True)
    return b_pq, warpgroup_mma_wait(0, deps=(b_sums,)), b_vinv      # [BM, SUM_N] sums


@gluon.jit(do_not_specialize=PACKING_INTS)
def attn_fwd_gluon_kernel(q_desc, p_qe, k_desc, vt_desc, p_krec, p_pv, p_cu_q, p_cu_k, p_cu_kt, p_work, width,
                          p_o, p_lse, p_mo, p_ro,
                          total_q, total_k, tk_t, heads_q, heads_kv, s2, window_left, window_right, vtd_desc,
                          TAU: gl.constexpr, SIGMA: gl.constexpr, D: gl.constexpr,
                          BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, SCALE_BLOCK: gl.constexpr,
                          CODES: gl.constexpr, P4: gl.constexpr, ROW_SUM: gl.constexpr, SUM_BLOCK: gl.constexpr,
                          DIAG_BM: gl.constexpr, DIAG_BN: gl.constexpr, APPROX_EXP: gl.constexpr,
                          SCORE_CODES: gl.constexpr,
                          ALL4: gl.constexpr):
    """``attn_fwd._attn_fwd_kernel``'s arguments and outputs (BM = 64, 4 warps), with Q^, K^
    and V^T as TMA descriptors of their 2-D views [Tq, Hq D], [Tk, Hkv D], [Hkv D, Tk_t]
    (blocks [BM, D], [BN, D], [D, BN]); Q^ and K^ in SCORE_CODES (the mixed NVFP4 route's
    bf16 beside E4M3 V^), V^T in CODES; vtd_desc (ALL4 only, else None): the all-4-bit
    route's V^T with per-key scales, as V^T's, which its diagonal tiles multiply."""
    # The wgmma accumulators and P^ as the register A operand of P^ V^; S's accumulator
    # relayouts to P^ V^'s format for free.
    S_L: gl.constexpr = mma_layout(BN, SCORE_CODES)
    SP_L: gl.constexpr = mma_layout(BN, CODES)
    O_L: gl.constexpr = mma_layout(D, CODES)
    P_L: gl.constexpr = register_a_layout(O_L, CODES)
    ROW: gl.constexpr = gl.SliceLayout(1, S_L)
    COL: gl.constexpr = gl.SliceLayout(0, S_L)

    doc, tile = program_tile(p_work, width)  # longest documents, and their last tiles, first
    if doc < 0:
        return
    h, hk, q_start, len_q, len_k, k_start, k_start_t, i0, off, wl, wr, t_lo, u_lo, u_hi, t_hi = program_geometry(
        doc, tile, p_cu_q, p_cu_k, p_cu_kt, heads_q, heads_kv, window_left, window_right, BM, BN)
    p_krec_doc = p_krec + hk.to(gl.int64) * total_k + k_start
    n_k = total_k - k_start

    q_s = gl.allocate_shared_memory(SCORE_CODES, [BM, D], q_desc.layout)
    k_s = gl.allocate_shared_memory(SCORE_CODES, [STAGES, BN, D], k_desc.layout)
    v_s = gl.allocate_shared_memory(CODES, [STAGES, D, BN], vt_desc.layout)
    bars = copy_barriers(STAGES + 1)  # the last: Q^'s
    ind_s = None
    if SUM_BLOCK > 1:  # l from the codes' block sums by an MMA (``_mma_block_sums``)
        ind_s = _block_indicator(BN, SUM_BLOCK)
    # Rows of Q^ past the document are the next document's (or zeros): their outputs are not
    # stored. Tiles past t_hi are copied too and never read, so the loop needs no bounds on
    # its copies; the last STAGES - 2 of them are waited for before the program ends.
    mbarrier.expect(bars.index(STAGES), q_desc.block_type.nbytes)
    tma_load(q_desc, [q_start + i0, h * D], bars.index(STAGES), q_s)
    diag_i0 = i0 // DIAG_BM * DIAG_BM
    for i in gl.static_range(STAGES - 1):
        _copy_key_tile(k_desc, vt_desc, vtd_desc, k_s, v_s, bars, i, t_lo + i, hk, k_start, k_start_t, diag_i0,
                       len_q, len_k, off, wl, wr, D, BN, DIAG_BM, DIAG_BN, ALL4)

    o_m = i0 + gl.arange(0, BM, layout=ROW)                         # [BM] query positions
    b_first, b_last = visible_keys(o_m, off, wl, wr, len_k)
    m_row = o_m < len_q
    o_row = q_start.to(gl.int64) + o_m                              # packed query rows
    b_qf = query_factors(p_qe, o_row, m_row, heads_q, h, s2, CODES)  # [BM]
    b_pv = gl.load(p_pv + o_row * heads_kv + hk, mask=m_row, other=0)  # [BM] int32
    b_rf = pow2(SIGMA - b_pv)
    b_acc = gl.zeros([BM, D], gl.float32, layout=O_L)
    b_l = gl.zeros([BM], gl.float32, layout=ROW)
    b_m = gl.full([BM], float("-inf"), gl.float32, layout=ROW)
    o_nb = gl.arange(0, BN, layout=COL)                             # [BN]

    mbarrier.wait(bars.index(STAGES), 0)
    s_next = _issue_scores(q_s, k_s, bars, 0, BM, BN, STAGES, S_L)
    rec_next = block_key_records(p_krec_doc, t_lo * BN, o_nb, n_k, SCALE_BLOCK, BN)  # [BN] int32
    for t in range(t_lo, t_hi):
        j = t - t_lo
        o_n = t * BN + o_nb
        b_kf, b_vf = record_factors(rec_next)                       # [BN] fp32 2^eK, 2^eV
        # The next tile's words load under this tile's products and softmax.
        rec_next = block_key_records(p_krec_doc, (t + 1) * BN, o_nb, n_k, SCALE_BLOCK, BN)
        b_s = warpgroup_mma_wait(0, deps=(s_next,))                 # [BM, BN] this tile's Q^ K^T
        # The slot tile j - 1 used is free: both its products have completed.
        _copy_key_tile(k_desc, vt_desc, vtd_desc, k_s, v_s, bars, (j + STAGES - 1) % STAGES, t + STAGES - 1, hk,
                       k_start, k_start_t, diag_i0, len_q, len_k, off, wl, wr, D, BN, DIAG_BM, DIAG_BN, ALL4)
        b_y = scaled(b_s, b_kf[None, :], CODES)                     # [BM, BN]
        # The next tile's scores run under this tile's softmax (after the last tile, on
        # keys no row reads: one product per program is spent to keep the loop uniform).
        # Issued once b_s is read, its product can take b_s's registers: the loop then
        # carries it without ~64 register moves per tile.
        s_next = _issue_scores(q_s, k_s, bars, j + 1, BM, BN, STAGES, S_L)
        diag = diagonal_tile(t * BN // DIAG_BN, diag_i0, len_q, len_k, off, wl, wr, DIAG_BM, DIAG_BN)
        sums_arg = None
        if SUM_BLOCK > 1:
            sums_arg = (ind_s, _block_vinv(p_krec_doc, t * BN, n_k, BN, SUM_BLOCK))
        b_pq, b_alpha, b_l, b_m = scores_to_codes(b_y, b_qf, b_vf, b_rf, b_l, b_m, o_n, b_first, b_last, TAU,
                                                  (t < u_lo) | (t >= u_hi), CODES, False, relayout, ROW,
                                                  P4, diag, S_L, ROW_SUM, len_k, APPROX_EXP, SUM_BLOCK,
                                                  _mma_block_sums, sums_arg)
        # E4M3: P^ V^ from zero, added in fp32; BF16: into the rescaled acc inside the MMA
        # (attn_fwd._attend_tile says why).
        b_pq = relayout(b_pq, SP_L)
        b_p_op = gl.convert_layout(mma_token_order(b_pq, CODES), P_L, assert_trivial=True)
        if CODES == gl.bfloat16:
            # alpha is 1 on every row unless a row's max rose past tau, and acc * 1 is acc: the
            # rescale (64 multiplies per thread) runs only then, at the cost of one reduction
            if gl.min(b_alpha, axis=0) < 1.0:
                b_acc = b_acc * gl.convert_layout(b_alpha, gl.SliceLayout(1, O_L))[:, None]
            b_acc = warpgroup_mma(b_p_op, v_s.index(j % STAGES).permute((1, 0)), b_acc, is_async=True)
            b_acc = warpgroup_mma_wait(0, deps=(b_acc,))           # [BM, D]
        else:
            b_tile_o = warpgroup_mma(b_p_op, v_s.index(j % STAGES).permute((1, 0)),
                                     gl.zeros([BM, D], gl.float32, layout=O_L), use_acc=False, is_async=True)
            b_tile_o = warpgroup_mma_wait(0, deps=(b_tile_o,))     # [BM, D]
            b_acc = b_acc * gl.convert_layout(b_alpha, gl.SliceLayout(1, O_L))[:, None] + b_tile_o
    warpgroup_mma_wait(0, deps=(s_next,))
    n = t_hi - t_lo
    for i in gl.static_range(STAGES - 2):
        wait_copy(bars, n + 1 + i, STAGES)

    b_ro, b_lse, b_m = finish_rows(b_l, b_m, b_pv, SIGMA)
    b_o = to_output(b_acc * gl.convert_layout(b_ro, gl.SliceLayout(1, O_L))[:, None], p_o.dtype.element_ty, False)
    o_mo = i0 + gl.arange(0, BM, layout=gl.SliceLayout(1, O_L))
    o_do = gl.arange(0, D, layout=gl.SliceLayout(0, O_L))
    p_o_tile = p_o + ((q_start.to(gl.int64) + o_mo)[:, None] * heads_q + h) * D + o_do[None, :]  # [BM, D]
    gl.store(p_o_tile, b_o, mask=(o_mo < len_q)[:, None])
    o_stat = h.to(gl.int64) * total_q + o_row
    gl.store(p_lse + o_stat, b_lse, mask=m_row)
    gl.store(p_mo + o_stat, b_m, mask=m_row)
    gl.store(p_ro + o_stat, b_ro, mask=m_row)


def operand_descriptors(q_codes, k_codes, v_codes_t, block_m: int, block_n: int, v_codes_t_diag=None):
    """Host TMA descriptors of the forward's operands in the 2-D views and blocks that
    ``attn_fwd_gluon_kernel`` reads: Q^ [Tq, Hq D] by [BM, D], K^ [Tk, Hkv D] by [BN, D],
    V^T [Hkv D, Tk_t] by [D, BN], and the all-4-bit route's v_codes_t_diag as V^T (None
    without it). q_codes [Tq, Hq, D], k_codes [Tk, Hkv, D], v_codes_t [Hkv, D, Tk_t]:
    contiguous codes (float8_e4m3fn or bfloat16)."""
    d = q_codes.shape[-1]
    vt_views = [v_codes_t] + ([] if v_codes_t_diag is None else [v_codes_t_diag])
    descs = code_descriptors((q_codes.flatten(1), [block_m, d]), (k_codes.flatten(1), [block_n, d]),
                             *((vt.flatten(0, 1), [d, block_n]) for vt in vt_views))
    return (*descs, None) if v_codes_t_diag is None else descs
