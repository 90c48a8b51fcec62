"""The dQ kernel of ``attn_bwd.py`` in Gluon, for Hopper: TMA copies of the key steps, key words
read once per scale block.

Each key step reads K^ [BN, D], V^ [BN, D] and K^T [D, BN] (the bf16 recipe not K^T: its dQ = G K^
reads K^'s tile as an MN-major BF16 operand). The Triton kernel loads them
with per-thread addresses and keeps a key factor per key in registers (48 of them); here one
thread issues TMA copies of whole tiles into NVMMA-swizzled shared memory, STAGES - 1 steps
ahead, and the key words come once per 32-key block (``records.block_key_records``). The
three products are asynchronous wgmma (E4M3 or BF16 operands, ``CODES``): each step issues
its dQ tile's product and then the next step's S and dP, and adds the dQ tile while those
run (BF16: accumulates it inside the MMA), so the tensor cores go from one step's products to
the next without waiting for the sum.

The step order (the full steps, then the masked ones: dQ's fp32 sum follows it), the
payload (``bwd_math.grad_scores``, ``row_scaled_codes``; the all-4-bit route's E2M1 G,
``bwd_math.e2m1_payload``) and the epilogue (``store_dq``) are the Triton
kernel's helpers, and the wgmma shapes are those Triton picks, so dQ equals the
Triton kernel's bit for bit (the GPU tests check it). Gluon has no CPU interpreter: under
TRITON_INTERPRET the Triton kernel runs, and the CPU suite checks it against the emulator.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait

from .bwd_math import (doc_bounds, e2m1_payload, forward_diagonal, grad_scores, masked_step, query_factors,
                       row_parts, row_scaled_codes, step_range, store_dq)
from .fp8 import pow2_reciprocal, to_codes
from .gluon_tma import (WARPS, code_descriptors, copy_barriers, mma_layout, register_a_layout, relayout, tma_load,
                        wait_copy, zero_rows_from)
from .launch import PACKING_INTS
from .layout import mma_token_order
from .records import block_key_records, query_fields_by_word, record_factors
from .worklist import program_tile


@gluon.jit
def _copy_keys(k_desc, v_desc, kt_desc, k_s, v_s, kt_s, bars, slot, k_row, kv_col, kt_row, kt_col,
               ROWS: gl.constexpr):
    """Start the TMA copies of one key step, K^ and V^ [BN, D] at (k_row, kv_col) and K^T
    [D, BN] at (kt_row, kt_col) unless ROWS, into slot ``slot`` of k_s, v_s, kt_s, all
    completing bars[slot]. Keys past the document are the next document's finite codes (zeros
    past a tensor's end): their payload is zero, as in the Triton kernel's masked steps."""
    bar = bars.index(slot)
    KT_BYTES: gl.constexpr = 0 if ROWS else kt_desc.block_type.nbytes
    mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes + KT_BYTES)
    tma_load(k_desc, [k_row, kv_col], bar, k_s.index(slot))
    tma_load(v_desc, [k_row, kv_col], bar, v_s.index(slot))
    if not ROWS:
        tma_load(kt_desc, [kt_row, kt_col], bar, kt_s.index(slot))


@gluon.jit
def _copy_step(k_desc, v_desc, kt_desc, ktd_desc, k_s, v_s, kt_s, bars, slot, k0, k_row, h_k, kt_col, i0, geo,
               D: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, GRAD4: gl.constexpr, ROWS: gl.constexpr):
    """``_copy_keys`` of the key step from document key k0 into slot; the all-4-bit route's
    steps on diagonal dQ tiles (GRAD4 > 0) copy K^T with per-key scales from ktd_desc."""
    if GRAD4 > 0:
        if forward_diagonal(i0, k0, geo, BM, BN):
            _copy_keys(k_desc, v_desc, ktd_desc, k_s, v_s, kt_s, bars, slot, k_row + k0, h_k * D, h_k * D,
                       kt_col + k0, ROWS)
        else:
            _copy_keys(k_desc, v_desc, kt_desc, k_s, v_s, kt_s, bars, slot, k_row + k0, h_k * D, h_k * D,
                       kt_col + k0, ROWS)
    else:
        _copy_keys(k_desc, v_desc, kt_desc, k_s, v_s, kt_s, bars, slot, k_row + k0, h_k * D, h_k * D, kt_col + k0,
                   ROWS)


@gluon.jit
def _issue_scores(q_s, do_s, k_s, v_s, bars, n, STAGES: gl.constexpr, b_zero_s, b_zero):
    """Wait for key step n's copies (slot n % STAGES) and start S = Q^ K^T and dP = dO^ V^T
    [BM, BN] on them (b_zero_s, b_zero: fp32 zeros in their layouts)."""
    slot = n % STAGES
    wait_copy(bars, n, STAGES)
    b_s = warpgroup_mma(q_s, k_s.index(slot).permute((1, 0)), b_zero_s, use_acc=False, is_async=True)
    b_dp = warpgroup_mma(do_s, v_s.index(slot).permute((1, 0)), b_zero, use_acc=False, is_async=True)
    return b_s, b_dp


@gluon.jit
def _step(n, n_full, lo, full_lo, full_hi):
    """The n-th key step a program visits: the full steps [full_lo, full_hi), then the masked
    ones (``masked_step``), the Triton kernel's order."""
    return gl.where(n < n_full, full_lo + n, masked_step(n - n_full, lo, full_lo, full_hi))


@gluon.jit(do_not_specialize=PACKING_INTS)
def dq_gluon_kernel(q_desc, do_desc, k_desc, v_desc, kt_desc, p_rec, p_krec, p_cu_q, p_cu_k, p_cu_qt, p_cu_kt,
                    p_work, width, p_dq, s2, scale, inv_sqrt_d, wl, wr, total_q, total_k, heads_q, ktd_desc, p_rk,
                    GROUP: gl.constexpr, D: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                    SCALE_BLOCK: gl.constexpr, STAGES: gl.constexpr, ROTATE_STAGES: gl.constexpr,
                    CODES: gl.constexpr, P4: gl.constexpr, FBM: gl.constexpr, FBN: gl.constexpr,
                    SCORE_CODES: gl.constexpr, GRAD4: gl.constexpr, ROWS: gl.constexpr):
    """``attn_bwd._dq_kernel``'s arguments and output (BM = 64, 4 warps) with Q^, dO^ ([Tq, Hq D]
    by [BM, D]), K^, V^ ([Tk, Hkv D] by [BN, D]) and K^T ([Hkv D, Tk_t] by [D, BN]) as TMA
    descriptors, and p_krec the ``key_records`` words; Q^ and K^ in SCORE_CODES (the mixed
    NVFP4 route's bf16 beside E4M3 codes). GRAD4, ktd_desc (K^T with per-key scales, as K^T's;
    None unless GRAD4 > 0) and p_rk (the dQ stream's ``random_bits.grad_row_parts``; None
    unless GRAD4 is 2): the all-4-bit route's, as the Triton kernel's. ROWS (the bf16 recipe):
    dQ = G K^ reads K^'s tile (wgmma takes BF16 B MN-major), so K^T is neither copied nor
    given shared memory."""
    SS_L: gl.constexpr = mma_layout(BN, SCORE_CODES)  # S's accumulator; relayouts to dP's
    S_L: gl.constexpr = mma_layout(BN, CODES)
    O_L: gl.constexpr = mma_layout(D, CODES)
    G_L: gl.constexpr = register_a_layout(O_L, CODES)
    ROW: gl.constexpr = gl.SliceLayout(1, S_L)
    # The epilogue's: a token row per thread, so the rotation's butterflies stay in registers.
    TOKEN_ROWS: gl.constexpr = gl.BlockedLayout([1, D], [32, 1], [WARPS, 1], [1, 0])

    doc, tile = program_tile(p_work, width)
    if doc < 0:
        return
    h_q = gl.program_id(1)
    h_k = h_q // GROUP
    q_start, len_q, _, _ = doc_bounds(p_cu_q, p_cu_qt, doc)
    k_start, len_k, k_start_t, _ = doc_bounds(p_cu_k, p_cu_kt, doc)
    i0 = tile * BM
    geo = (len_q, len_k, wl, wr)
    # Query i sees the keys k with i + off - wl <= k <= i + off + wr.
    lo, hi, full_lo, full_hi = step_range(i0, len_q, len_k, len_k - len_q, wl, wr, BM, BN)
    n_full = full_hi - full_lo
    n_steps = n_full + (full_lo - lo) + (hi - full_hi)
    k_row, kt_col = k_start.to(gl.int32), k_start_t.to(gl.int32)  # TMA coordinates

    q_s = gl.allocate_shared_memory(SCORE_CODES, [BM, D], q_desc.layout)
    do_s = gl.allocate_shared_memory(CODES, [BM, D], do_desc.layout)
    k_s = gl.allocate_shared_memory(SCORE_CODES, [STAGES, BN, D], k_desc.layout)
    v_s = gl.allocate_shared_memory(CODES, [STAGES, BN, D], v_desc.layout)
    if ROWS:
        kt_s = k_s
    else:
        kt_s = gl.allocate_shared_memory(CODES, [STAGES, D, BN], kt_desc.layout)
    bars = copy_barriers(STAGES + 1)  # the last: Q^'s and dO^'s
    # Rows of Q^ and dO^ past the document are the next document's: their records read m = +inf
    # and zeros, so their payload is zero and they are not stored. Steps past the last are
    # copied too (never read) and waited for before the program ends.
    mbarrier.expect(bars.index(STAGES), q_desc.block_type.nbytes + do_desc.block_type.nbytes)
    tma_load(q_desc, [q_start.to(gl.int32) + i0, h_q * D], bars.index(STAGES), q_s)
    tma_load(do_desc, [q_start.to(gl.int32) + i0, h_q * D], bars.index(STAGES), do_s)
    for i in gl.static_range(STAGES - 1):
        _copy_step(k_desc, v_desc, kt_desc, ktd_desc, k_s, v_s, kt_s, bars, i, _step(i, n_full, lo, full_lo, full_hi) * BN,
                   k_row, h_k, kt_col, i0, geo, D, BM, BN, GRAD4, ROWS)

    o_i = i0 + gl.arange(0, BM, layout=ROW)                         # [BM] query positions
    m_i = o_i < len_q
    p_rec_doc = p_rec + (h_q.to(gl.int64) * total_q + q_start) * 4
    qg, qry = query_factors(query_fields_by_word(p_rec_doc, o_i, m_i))
    qx = s2 * qg  # s2 rides on the query's factor, fixed for the whole tile
    p_krec_doc = p_krec + h_k.to(gl.int64) * total_k + k_start
    n_k = total_k - k_start
    rng = (p_rk, k_start)  # the tile rows' parts of G's random words, where GRAD4 == 2
    if GRAD4 == 2:
        rng = (row_parts(p_rk + h_q.to(gl.int64) * total_q + q_start, o_i, len_q), k_start)
    o_j = gl.arange(0, BN, layout=gl.SliceLayout(0, S_L))           # [BN]
    acc = gl.zeros([BM, D], gl.float32, layout=O_L)
    b_zero_ss = gl.zeros([BM, BN], gl.float32, layout=SS_L)
    b_zero_s = gl.zeros([BM, BN], gl.float32, layout=S_L)
    b_zero_o = gl.zeros([BM, D], gl.float32, layout=O_L)

    mbarrier.wait(bars.index(STAGES), 0)
    s_nxt, dp_nxt = _issue_scores(q_s, do_s, k_s, v_s, bars, 0, STAGES, b_zero_ss, b_zero_s)
    rec_next = block_key_records(p_krec_doc, _step(0, n_full, lo, full_lo, full_hi) * BN, o_j, n_k, SCALE_BLOCK, BN)
    for n in range(n_steps):
        k0 = _step(n, n_full, lo, full_lo, full_hi) * BN
        rec = rec_next  # the next step's words load under this step's products and payload
        rec_next = block_key_records(p_krec_doc, _step(n + 1, n_full, lo, full_lo, full_hi) * BN, o_j, n_k,
                                     SCALE_BLOCK, BN)
        b_s, b_dp = warpgroup_mma_wait(0, deps=(s_nxt, dp_nxt))    # [BM, BN] S, dP before their factors
        # The slot step n - 1 used is free: its products have completed.
        _copy_step(k_desc, v_desc, kt_desc, ktd_desc, k_s, v_s, kt_s, bars, (n + STAGES - 1) % STAGES,
                   _step(n + STAGES - 1, n_full, lo, full_lo, full_hi) * BN, k_row, h_k, kt_col, i0, geo, D, BM, BN,
                   GRAD4, ROWS)
        kf, vf = record_factors(rec)                                # [BN] 2^eK, 2^eV
        b_g = grad_scores(relayout(b_s, S_L), b_dp, qx, kf, qry, vf, o_i, k0 + o_j, geo, 0, n >= n_full, CODES,
                          False, P4, forward_diagonal(i0, k0, geo, FBM, FBN), relayout, S_L)[1]  # G
        b_init = b_zero_o
        if GRAD4 > 0:  # E2M1 with its scales folded in, exact in BF16: accumulates as BF16 does
            b_gc = to_codes(relayout(e2m1_payload(b_g, rng, k0 + o_j, 0, GRAD4), S_L), CODES, False)
            b_init = acc
        elif CODES == gl.bfloat16:  # BF16 payloads take no scale: the product accumulates into acc in the MMA
            b_gc = to_codes(b_g, CODES, False)
            b_init = acc
        else:
            b_gc, b_f = row_scaled_codes(b_g, False)  # G's codes
        if ROWS:
            if k0 + BN > len_k:  # the document's last key step: rows past it are the next one's
                zero_rows_from(k_s.index(n % STAGES), len_k - k0)
            b_kb = k_s.index(n % STAGES)                             # [BN, D], MN-major
        else:
            b_kb = kt_s.index(n % STAGES).permute((1, 0))
        b_t = warpgroup_mma(gl.convert_layout(mma_token_order(b_gc, CODES), G_L, assert_trivial=True), b_kb, b_init,
                            use_acc=CODES == gl.bfloat16, is_async=True)
        # The next step's products queue behind this dQ tile and run under its sum (after
        # the last step, on keys no row reads: two products per program kept for a uniform loop).
        s_nxt, dp_nxt = _issue_scores(q_s, do_s, k_s, v_s, bars, n + 1, STAGES, b_zero_ss, b_zero_s)
        b_t = warpgroup_mma_wait(2, deps=(b_t,))                   # [BM, D]
        if CODES == gl.bfloat16:
            acc = b_t
        else:
            acc = acc + b_t * gl.convert_layout(b_f, gl.SliceLayout(1, O_L))[:, None]
    warpgroup_mma_wait(0, deps=(s_nxt, dp_nxt))
    for i in gl.static_range(STAGES - 2):
        wait_copy(bars, n_steps + 1 + i, STAGES)

    # 2^-eQ of dQ's code scale, exact before the softmax scale's one rounding (NUMERICS.md 4)
    acc = acc * gl.convert_layout(pow2_reciprocal(qg), gl.SliceLayout(1, O_L))[:, None]
    o_r = i0 + gl.arange(0, BM, layout=gl.SliceLayout(1, TOKEN_ROWS))
    o_d = gl.arange(0, D, layout=gl.SliceLayout(0, TOKEN_ROWS))
    store_dq(p_dq, gl.convert_layout(acc, TOKEN_ROWS), q_start + o_r, o_d,
             o_r < len_q, h_q, heads_q, scale, inv_sqrt_d, ROTATE_STAGES, False)


def dq_descriptors(q_codes, do_codes, k_codes, v_codes, k_codes_t, block_m: int, block_n: int, k_codes_t_diag=None):
    """Host TMA descriptors of the dQ kernel's operands in the 2-D views and blocks that
    ``dq_gluon_kernel`` reads: Q^, dO^ [Tq, Hq D] by [BM, D]; K^, V^ [Tk, Hkv D] by [BN, D];
    K^T [Hkv D, Tk_t] by [D, BN] (None where the kernel reads K^'s rows, ROWS), and the
    all-4-bit route's k_codes_t_diag as K^T (None without it). Codes contiguous,
    float8_e4m3fn or bfloat16."""
    d = q_codes.shape[-1]
    descs = code_descriptors((q_codes.flatten(1), [block_m, d]), (do_codes.flatten(1), [block_m, d]),
                             (k_codes.flatten(1), [block_n, d]), (v_codes.flatten(1), [block_n, d]))
    kt_descs = tuple(None if kt is None else code_descriptors((kt.flatten(0, 1), [d, block_n]))[0]
                     for kt in (k_codes_t, k_codes_t_diag))
    return descs + kt_descs
