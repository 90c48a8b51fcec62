"""The dK/dV kernel of ``attn_bwd.py`` in Gluon, for Hopper: the GPU's dK/dV.

A program holds one key tile (K^, V^ [BN, D] in shared memory: the A operands of S^T = K^ Q^T
and dP^T = V^ dO^T, where the Triton kernel keeps them in 32 registers) and visits the query
steps of its GQA group's heads. Each step's Q^, dO^ [BM, D] and Q^T, dOt^T [D, BM] arrive by
TMA with their query records, STAGES - 1 steps ahead (on the bf16 route only Q^ and dO^: its dK
and dV read them as MN-major BF16 operands, two tiles per step instead of four); a thread reads
each record as one 16-byte load from shared memory, in a layout whose split fields are the S^T
accumulator's columns (``query_record_layout``). All products are asynchronous wgmma (E4M3 or BF16, ``CODES``).

A step of 64 queries (``bwd_block_m``, the numerics' query step) runs S^T and dP^T in two
halves of 32, the second half's issued under the first half's payload, and chains dV's and
dK's products over both halves in one fresh accumulator each (the Triton kernel's K = 64
products, instruction for instruction), with one row scale of the dK payload over the step
(``_pair_scaled_codes``). The halves keep the live registers of a 32-query step (64-query
S^T and dP^T tiles spill), while each step's accumulator adds, copies and bookkeeping serve
twice the queries. Each half's query records are read as TMA copied them, without a select
on the document's end (only masked steps reach past it, and their visibility rule zeroes
those queries), and before the wait for its S^T and dP^T, so the reads run under the
products. The key words come once per 32-key block (``block_key_records``), so a thread's
two key rows share vf and grad_scores' vf rf is one value per query column. The register A
operands (P^T, G^T) convert from their accumulators without shuffles, because the
transposed codes hold each 16 tokens in the MMA's token order (``layout.mma_token_order``).

The step order (per head, the full steps then the masked ones), the payload
(``bwd_math.grad_scores``, ``row_scaled_codes``) and the wgmma shapes are the Triton kernel's,
so dK and dV equal its bit for bit (the GPU test ``test_gluon_dkdv_equals_triton``, 9 cases
at 64- and at 32-query steps). dQ through atomics (``AttnTiles.dq_atomic``) stays with the
Triton kernel.
"""
import functools

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait

from .bwd_math import (doc_bounds, e2m1_payload, forward_diagonal, grad_scores, masked_step, query_factors,
                       row_parts, row_scaled_codes, step_range)
from .fp8 import E4M3_EQ, E4M3_MQ, mul_rn, pow2, pow2_reciprocal, scale_exponent, to_codes, to_e4m3, to_output
from .fwd_math import group_exponent
from .gluon_tma import (WARPS, code_descriptors, copy_barriers, cta_barrier, descriptor, mma_layout, register_a_layout,
                        relayout, tma_load, wait_copy, zero_rows_from)
from .hadamard import rotate
from .launch import PACKING_INTS
from .layout import mma_token_order
from .records import block_key_records, query_record_fields, record_factors
from .worklist import program_tile

# The query records' shared layout (int32 [BM, 4], unswizzled), built once for the host descriptors.
_RECORDS_SHARED = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)


@gluon.jit
def _copy_queries(descs, smem, bars, slot, row, col, row_t, col_t, rec_row, ROWS: gl.constexpr):
    """Start the TMA copies of one query step, Q^ and dO^ [BM, D] at (row, col), Q^T and dOt^T
    [D, BM] at (row_t, col_t) unless ROWS, and the query records [BM, 4] at (rec_row, 0), into
    slot ``slot``, all completing bars[slot]. Queries past the document are the next document's
    finite codes and records (zeros past a tensor's end): masked steps see them as not visible,
    so their P and G are zero."""
    q_desc, do_desc, qt_desc, dott_desc, rec_desc = descs
    q_s, do_s, qt_s, dott_s, rec_s = smem
    bar = bars.index(slot)
    # every tile's own bytes: Q^ may be the mixed route's bf16 beside E4M3 dO^
    T_BYTES: gl.constexpr = 0 if ROWS else qt_desc.block_type.nbytes + dott_desc.block_type.nbytes
    mbarrier.expect(bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes + T_BYTES
                    + rec_desc.block_type.nbytes)
    tma_load(q_desc, [row, col], bar, q_s.index(slot))
    tma_load(do_desc, [row, col], bar, do_s.index(slot))
    if not ROWS:
        tma_load(qt_desc, [row_t, col_t], bar, qt_s.index(slot))
        tma_load(dott_desc, [row_t, col_t], bar, dott_s.index(slot))
    tma_load(rec_desc, [rec_row, 0], bar, rec_s.index(slot))


@gluon.jit
def _columns(x, QRY: gl.constexpr):
    """x [32] in the S^T accumulator's column layout (a half-step): the same registers (``query_record_layout``)."""
    return gl.convert_layout(x, QRY, assert_trivial=True)


@gluon.jit
def _query_step(t, n_full, lo, full_lo, full_hi):
    """(query step index, masked) of a head's t-th step: the full steps [full_lo, full_hi),
    then the masked ones (``masked_step``), the Triton kernel's order."""
    return gl.where(t < n_full, full_lo + t, masked_step(t - n_full, lo, full_lo, full_hi)), t >= n_full


@gluon.jit
def _next(g, t, n_head):
    """The (head in the group, step) that follows (g, t), heads of n_head steps each."""
    wrap = t + 1 == n_head
    return g + wrap.to(gl.int32), gl.where(wrap, 0, t + 1)


@gluon.jit
def _copy_step(g, t, slot, n_full, lo, full_lo, full_hi, h_k, q_row, q_col_t, total_q, GROUP: gl.constexpr,
               BM: gl.constexpr, D: gl.constexpr, descs, smem, bars, ROWS: gl.constexpr):
    """The copies of head g's t-th step into slot ``slot`` (``_copy_queries``)."""
    j = _query_step(t, n_full, lo, full_lo, full_hi)[0]
    h_q = h_k * GROUP + g
    _copy_queries(descs, smem, bars, slot, q_row + j * BM, h_q * D, h_q * D, q_col_t + j * BM,
                  h_q * total_q + q_row + j * BM, ROWS)


@gluon.jit
def _issue_half(k_s, v_s, q_s, do_s, slot, h, SUB: gl.constexpr, b_zero_s, b_zero):
    """Start S^T = K^ Q^T and dP^T = V^ dO^T [BN, SUB] on queries h SUB.. of the step in ``slot``
    (b_zero_s, b_zero: fp32 zeros in their layouts)."""
    b_st = warpgroup_mma(k_s, q_s.index(slot).slice(h * SUB, SUB).permute((1, 0)), b_zero_s, use_acc=False,
                         is_async=True)
    b_dpt = warpgroup_mma(v_s, do_s.index(slot).slice(h * SUB, SUB).permute((1, 0)), b_zero, use_acc=False,
                          is_async=True)
    return b_st, b_dpt


@gluon.jit
def _issue_scores(k_s, v_s, q_s, do_s, bars, n, STAGES: gl.constexpr, SUB: gl.constexpr, b_zero_s, b_zero):
    """Wait for the n-th step's copies and start its first half's S^T and dP^T (``_issue_half``)."""
    wait_copy(bars, n, STAGES)
    return _issue_half(k_s, v_s, q_s, do_s, n % STAGES, 0, SUB, b_zero_s, b_zero)


@gluon.jit
def _half_factors(rec_s, REC_L: gl.constexpr, QRY: gl.constexpr, SCALE_BLOCK: gl.constexpr):
    """(qg, (m, rf, rq, deltad)) [SUB] each, in the S^T accumulator's column layout, of a half
    step's query records rec_s [SUB, 4] in shared memory (``query_factors``). Records are read
    as copied: a query past the document holds the next rows' finite words (or TMA's zeros),
    and only masked steps reach past the document, where the visibility rule makes its P, and
    so its W, zero. With SCALE_BLOCK > 1 a half step is one scale block of queries (32 from a
    multiple of 32 past the document's first), so qg is its first row's 2^eQ in every column:
    one value, which ``grad_scores`` folds into its factor per key row."""
    m_q, rq, deltad, qg, rf = query_record_fields(rec_s.load(REC_L))  # [SUB] each
    qg = _columns(qg, QRY)
    if SCALE_BLOCK > 1:
        W_L: gl.constexpr = gl.BlockedLayout([1, 4], [32, 1], [WARPS, 1], [1, 0])
        qg0 = query_record_fields(rec_s.slice(0, 1).load(W_L))[3]  # [1]
        qg = gl.full([rec_s.shape[0]], 1.0, gl.float32, layout=QRY) * gl.max(qg0, axis=0)
    return query_factors((_columns(m_q, QRY), _columns(rq, QRY), _columns(deltad, QRY), qg, _columns(rf, QRY)))


@gluon.jit
def _queries_b(b_s, h, SUB: gl.constexpr, ROWS: gl.constexpr):
    """Queries h SUB.. of a step's B operand as [SUB, D]: b_s is [D, BM] (K-major, the
    transposed codes) or with ROWS [BM, D] (row codes, MN-major: BF16 only)."""
    if ROWS:
        b = b_s.slice(h * SUB, SUB)
    else:
        b = b_s.slice(h * SUB, SUB, dim=1).permute((1, 0))
    return b


@gluon.jit
def _step_product(b_a0, b_a1, b_s, BM: gl.constexpr, A_L: gl.constexpr, CODES: gl.constexpr, ROWS: gl.constexpr,
                  acc):
    """acc + A @ B over a step's queries, [BN, D] fp32: the halves' register A operands b_a0,
    b_a1 [BN, 32] (b_a1 unused when BM = 32) against the step's B operand b_s in shared memory
    (``_queries_b``), chained as one K = BM product's instructions. E4M3 products start from
    zero (acc: zeros, not read) to take their step's scale; BF16 ones accumulate into acc
    inside the MMA, as the Triton kernel's ``tl.dot`` with an accumulator does."""
    SUB: gl.constexpr = b_a0.shape[1]
    acc = warpgroup_mma(gl.convert_layout(mma_token_order(b_a0, CODES), A_L, assert_trivial=True),
                        _queries_b(b_s, 0, SUB, ROWS), acc, use_acc=CODES == gl.bfloat16, is_async=True)
    if BM == 2 * SUB:
        acc = warpgroup_mma(gl.convert_layout(mma_token_order(b_a1, CODES), A_L, assert_trivial=True),
                            _queries_b(b_s, 1, SUB, ROWS), acc, is_async=True)
    return warpgroup_mma_wait(0, deps=(acc,))


@gluon.jit
def _key_group_exponents(b_src, AXIS: gl.constexpr, LOG_SRC: gl.constexpr):
    """``fwd_math.group_exponents`` of b_src [BN / 32, 32, SUB] (an S^T half reshaped: each
    32-key group spans two warps), the same bits with the work shared out: a thread's two
    rows reduce in registers, and the partial maxima go through shared memory to one thread
    per (group, query), which reads 16, takes the exponent and hands it back. (With tl.max
    the compiler reduces by a butterfly of 24 shuffles, and every thread takes the exponents
    of all 8 of its (group, query) pairs, each of which 16 threads hold.)"""
    gl.static_assert(AXIS == 1)
    G: gl.constexpr = b_src.shape[0]
    C: gl.constexpr = b_src.shape[2]
    gl.static_assert((G == 2) & (C == 32) & (WARPS == 4))
    # key row in a group = 16 (warp % 2) + 8 (register pair) + lane / 4
    b_part = gl.max(gl.reshape(b_src, [G, 2, 2, 8, C]), axis=2)     # [G, 2, 8, C]
    part_s = gl.allocate_shared_memory(gl.float32, [G, 2, 8, C], gl.SwizzledSharedLayout(1, 1, 1, [3, 2, 1, 0]))
    # allocated now, so that it does not reuse part_s's bytes (a third barrier)
    exp_s = gl.allocate_shared_memory(gl.int32, [G, C], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    part_s.store(b_part)
    cta_barrier()
    # a (group, query) per thread, twice over: its 16 partials in registers
    OWN: gl.constexpr = gl.BlockedLayout([1, 2, 8, 1], [1, 1, 1, 32], [2, 1, 1, 2], [3, 2, 1, 0])
    exp_s.store(group_exponent(gl.max(gl.max(part_s.load(OWN), axis=2), axis=1), LOG_SRC))  # [G, C]
    cta_barrier()
    return gl.expand_dims(exp_s.load(gl.SliceLayout(AXIS, b_src.type.layout)), AXIS)  # [G, 1, C]


@gluon.jit
def _pair_scaled_codes(b_w0, b_w1):
    """``row_scaled_codes`` of the row-wise concatenation [b_w0 | b_w1]: one exponent per row
    from both halves' maxima, the halves' codes and the factors 2^e."""
    amax = gl.maximum(gl.max(gl.abs(b_w0), axis=1), gl.max(gl.abs(b_w1), axis=1))
    e = scale_exponent(amax, E4M3_EQ, E4M3_MQ)                       # [BN]
    f = pow2(-e)[:, None]
    return to_e4m3(b_w0 * f, False), to_e4m3(b_w1 * f, False), pow2(e)


@gluon.jit(do_not_specialize=PACKING_INTS)
def dkdv_gluon_kernel(q_desc, do_desc, qt_desc, dott_desc, rec_desc, k_desc, v_desc, p_dote, p_krec, p_cu_q, p_cu_k,
                      p_cu_qt, p_cu_kt, p_work, width, p_dk, p_dv, s2, scale, inv_sqrt_d, wl, wr, total_q, total_k,
                      heads_q, p_rk, GROUP: gl.constexpr, D: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                      SCALE_BLOCK: gl.constexpr, STAGES: gl.constexpr, ROTATE_STAGES: gl.constexpr,
                      REC_L: gl.constexpr, CODES: gl.constexpr, P4: gl.constexpr, FBM: gl.constexpr,
                      FBN: gl.constexpr, SCORE_CODES: gl.constexpr, GRAD4: gl.constexpr, ROWS: gl.constexpr,
                      DOT_CODES: gl.constexpr):
    """``attn_bwd._dkdv_kernel``'s arguments and outputs without DQ_ATOMIC (BN = 64, 4 warps),
    with Q^, dO^ ([Tq, Hq D] by [BM, D]), Q^T, dOt^T ([Hq D, Tq_t] by [D, BM]) and K^, V^
    ([Tk, Hkv D] by [BN, D]) as TMA descriptors, p_krec the ``key_records`` words (exponents per
    SCALE_BLOCK keys from the document's start), and REC_L
    (``query_record_layout(32)``) the layout of a half-step's [32, 4] query records. BM is 32
    or 64 (``AttnTiles`` checks it). K^ and Q^ in SCORE_CODES (the mixed NVFP4 route's bf16
    beside E4M3 codes). GRAD4 and p_rk (the dK stream's ``random_bits.grad_row_parts``; None
    unless GRAD4 is 2): the all-4-bit route's E2M1 G^T, as the Triton kernel's, in groups of 16
    queries (a half holds two). ROWS (the bf16 recipe, NUMERICS.md 4a): dK = G^T Q^ and
    dV = bf16(P^ ro)^T dO^ read the row codes (wgmma takes BF16 B MN-major), so Q^T and dOt^T
    are neither copied nor given shared memory.
    DOT_CODES: dOt^T's format, the Triton kernel's (BF16 beside E4M3 CODES: dV's product in
    BF16 on P^'s values, accumulating inside the MMA)."""
    SUB: gl.constexpr = 32  # queries per S^T, dP^T product: a step of BM queries takes BM / SUB of them
    SS_L: gl.constexpr = mma_layout(SUB, SCORE_CODES)  # S^T's accumulator; relayouts to dP^T's
    S_L: gl.constexpr = mma_layout(SUB, CODES)
    O_L: gl.constexpr = mma_layout(D, CODES)
    A_L: gl.constexpr = register_a_layout(O_L, CODES)
    DV_L: gl.constexpr = mma_layout(D, DOT_CODES)  # dV's accumulator: O_L's registers
    DV_A_L: gl.constexpr = register_a_layout(DV_L, DOT_CODES)
    KEY: gl.constexpr = gl.SliceLayout(1, S_L)    # per key (rows of S^T)
    QRY: gl.constexpr = gl.SliceLayout(0, S_L)    # per query (columns)
    OKEY: gl.constexpr = gl.SliceLayout(1, O_L)
    # The epilogue's: a key row per thread, so the rotation's butterflies stay in registers.
    KEY_ROWS: gl.constexpr = gl.BlockedLayout([1, D], [32, 1], [WARPS, 1], [1, 0])

    doc, tile = program_tile(p_work, width)
    if doc < 0:
        return
    h_k = gl.program_id(1)
    heads_kv = heads_q // GROUP
    q_start, len_q, q_start_t, _ = doc_bounds(p_cu_q, p_cu_qt, doc)
    k_start, len_k, _, _ = doc_bounds(p_cu_k, p_cu_kt, doc)
    k0 = tile * BN
    geo = (len_q, len_k, wl, wr)
    # Key k is seen by the queries i with k - off - wr <= i <= k - off + wl.
    lo, hi, full_lo, full_hi = step_range(k0, len_k, len_q, len_q - len_k, wr, wl, BN, BM)
    n_full = full_hi - full_lo
    n_head = hi - lo
    n_steps = GROUP * n_head
    q_row, q_col_t = q_start.to(gl.int32), q_start_t.to(gl.int32)  # TMA coordinates

    k_s = gl.allocate_shared_memory(SCORE_CODES, [BN, D], k_desc.layout)
    v_s = gl.allocate_shared_memory(CODES, [BN, D], v_desc.layout)
    q_s = gl.allocate_shared_memory(SCORE_CODES, [STAGES, BM, D], q_desc.layout)
    do_s = gl.allocate_shared_memory(CODES, [STAGES, BM, D], do_desc.layout)
    if ROWS:
        qt_s, dott_s = q_s, do_s
    else:
        qt_s = gl.allocate_shared_memory(CODES, [STAGES, D, BM], qt_desc.layout)
        dott_s = gl.allocate_shared_memory(DOT_CODES, [STAGES, D, BM], dott_desc.layout)
    rec_s = gl.allocate_shared_memory(gl.int32, [STAGES, BM, 4], rec_desc.layout)
    bars = copy_barriers(STAGES + 1)  # the last: K^'s and V^'s
    descs = (q_desc, do_desc, qt_desc, dott_desc, rec_desc)
    smem = (q_s, do_s, qt_s, dott_s, rec_s)
    # Rows of K^ and V^ past the document are the next document's (or zeros): masked steps
    # hide them (P and G zero) and full steps never hold them. Steps past the last are copied
    # too (never read) and waited for before the program ends.
    mbarrier.expect(bars.index(STAGES), k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma_load(k_desc, [k_start.to(gl.int32) + k0, h_k * D], bars.index(STAGES), k_s)
    tma_load(v_desc, [k_start.to(gl.int32) + k0, h_k * D], bars.index(STAGES), v_s)
    # (g, t): head and step of the copy STAGES - 1 steps ahead of the loop's.
    g, t = 0, 0
    for i in gl.static_range(STAGES - 1):
        _copy_step(g, t, i, n_full, lo, full_lo, full_hi, h_k, q_row, q_col_t, total_q, GROUP, BM, D, descs, smem,
                   bars, ROWS)
        g, t = _next(g, t, n_head)

    o_kb = gl.arange(0, BN, layout=KEY)
    o_k = k0 + o_kb                                                  # [BN] key positions
    # A word per scale block: a thread's two key rows share one, so vf rf is one value per
    # query column (grad_scores' V fold).
    kf, vf = record_factors(block_key_records(p_krec + h_k.to(gl.int64) * total_k + k_start, k0, o_kb,
                                              total_k - k_start, SCALE_BLOCK, BN))
    vinv = pow2_reciprocal(vf)
    sx = s2 * kf  # s2 rides on the key's factor, fixed for the whole tile
    o_j = gl.arange(0, SUB, layout=QRY)                              # [SUB]
    acc_dk = gl.zeros([BN, D], gl.float32, layout=O_L)
    acc_dv = gl.zeros([BN, D], gl.float32, layout=DV_L)
    b_zero_ss = gl.zeros([BN, SUB], gl.float32, layout=SS_L)
    b_zero_s = gl.zeros([BN, SUB], gl.float32, layout=S_L)
    b_zero_o = gl.zeros([BN, D], gl.float32, layout=O_L)

    mbarrier.wait(bars.index(STAGES), 0)
    s_nxt, dp_nxt = _issue_scores(k_s, v_s, q_s, do_s, bars, 0, STAGES, SUB, b_zero_ss, b_zero_s)
    g_now, t_now = 0, 0  # the loop's head and step
    for n in range(n_steps):
        slot = n % STAGES
        j, masked = _query_step(t_now, n_full, lo, full_lo, full_hi)
        h_q = h_k * GROUP + g_now
        if DOT_CODES == gl.float8e4nv:
            # dOt^ has one exponent per query step: read it at the step's first row (inside the
            # document). BF16 dOt^ carries its own (0 for BF16 codes).
            e_dot = gl.load(p_dote + (q_start + j * BM) * heads_q + h_q).to(gl.int32)
        # Each half's rows' parts of G's random words (GRAD4 2), loaded under its products.
        rng0 = (p_rk, k_start)
        rng1 = rng0  # one half: unused
        if GRAD4 == 2:
            p_rk_doc = p_rk + h_q.to(gl.int64) * total_q + q_start
            rng0 = (row_parts(p_rk_doc, j * BM + o_j, len_q), k_start)
            if BM == 2 * SUB:
                rng1 = (row_parts(p_rk_doc, j * BM + SUB + o_j, len_q), k_start)
        # Each half's query factors are read and decoded while its S^T and dP^T run (the
        # step's records came with its codes: _issue_scores waited for them).
        qg, qry = _half_factors(rec_s.index(slot).slice(0, SUB), REC_L, QRY, SCALE_BLOCK)
        diag = forward_diagonal(j * BM, k0, geo, FBM, FBN)
        b_st, b_dpt = warpgroup_mma_wait(0, deps=(s_nxt, dp_nxt))   # [BN, SUB] S^T, dP^T before their factors
        if BM == 2 * SUB:  # the second half's products run under the first half's payload
            s_nxt, dp_nxt = _issue_half(k_s, v_s, q_s, do_s, slot, 1, SUB, b_zero_ss, b_zero_s)
        b_pc0, b_w0 = grad_scores(relayout(b_st, S_L), b_dpt, sx, qg, qry, vf, j * BM + o_j, o_k, geo, 1, masked,
                                  CODES, False, P4, diag, relayout, S_L, ROWS, DOT_CODES, _key_group_exponents)
        if BM == 2 * SUB:
            qg, qry = _half_factors(rec_s.index(slot).slice(SUB, SUB), REC_L, QRY, SCALE_BLOCK)
            b_st, b_dpt = warpgroup_mma_wait(0, deps=(s_nxt, dp_nxt))
            b_pc1, b_w1 = grad_scores(relayout(b_st, S_L), b_dpt, sx, qg, qry, vf, j * BM + SUB + o_j, o_k, geo, 1,
                                      masked, CODES, False, P4, diag, relayout, S_L, ROWS, DOT_CODES,
                                      _key_group_exponents)
        else:
            b_pc1, b_w1 = b_pc0, b_w0                                # one half: unused
        # The slot step n - 1 used is free: its products have completed.
        _copy_step(g, t, (n + STAGES - 1) % STAGES, n_full, lo, full_lo, full_hi, h_k, q_row, q_col_t, total_q,
                   GROUP, BM, D, descs, smem, bars, ROWS)
        g, t = _next(g, t, n_head)
        g_now, t_now = _next(g_now, t_now, n_head)
        if ROWS and j * BM + BM > len_q:  # the document's last step: rows past it are the next one's
            zero_rows_from(q_s.index(slot), len_q - j * BM)
            zero_rows_from(do_s.index(slot), len_q - j * BM)
        if DOT_CODES == gl.float8e4nv:
            b_dv = _step_product(b_pc0, b_pc1, dott_s.index(slot), BM, DV_A_L, DOT_CODES, ROWS, b_zero_o)  # [BN, D]
            acc_dv = acc_dv + b_dv * pow2(e_dot)
        else:  # BF16: no step exponent, so the product accumulates inside the MMA
            acc_dv = _step_product(b_pc0, b_pc1, dott_s.index(slot), BM, DV_A_L, DOT_CODES, ROWS, acc_dv)
        # dK's payload rows are keys: 2^eK and 2^-eV are constant along a row, the epilogue's.
        if GRAD4 > 0:  # E2M1 with its scales folded in, exact in BF16: accumulates as BF16 does
            b_gc0 = to_codes(relayout(e2m1_payload(b_w0, rng0, o_k, 1, GRAD4), S_L), CODES, False)
            b_gc1 = b_gc0  # one half: unused
            if BM == 2 * SUB:
                b_gc1 = to_codes(relayout(e2m1_payload(b_w1, rng1, o_k, 1, GRAD4), S_L), CODES,
                                 False)
        elif CODES == gl.bfloat16:                                   # W^T is G^T 2^(eV - eK)
            b_gc0, b_gc1 = to_codes(b_w0, CODES, False), to_codes(b_w1, CODES, False)  # no scale
        elif BM == 2 * SUB:
            b_gc0, b_gc1, b_f = _pair_scaled_codes(b_w0, b_w1)
        else:
            b_gc0, b_f = row_scaled_codes(b_w0, False)
            b_gc1 = b_gc0                                            # one half: unused
        if CODES == gl.bfloat16:
            acc_dk = _step_product(b_gc0, b_gc1, qt_s.index(slot), BM, A_L, CODES, ROWS, acc_dk)
        else:
            b_dk = _step_product(b_gc0, b_gc1, qt_s.index(slot), BM, A_L, CODES, ROWS, b_zero_o)  # [BN, D]
            acc_dk = acc_dk + b_dk * gl.convert_layout(b_f, OKEY)[:, None]
        s_nxt, dp_nxt = _issue_scores(k_s, v_s, q_s, do_s, bars, n + 1, STAGES, SUB, b_zero_ss, b_zero_s)
    warpgroup_mma_wait(0, deps=(s_nxt, dp_nxt))
    for i in gl.static_range(STAGES - 2):
        wait_copy(bars, n_steps + 1 + i, STAGES)

    o_r = k0 + gl.arange(0, BN, layout=gl.SliceLayout(1, KEY_ROWS))  # [BN] key positions, a row per thread
    o_d = gl.arange(0, D, layout=gl.SliceLayout(0, KEY_ROWS))
    o_out = ((k_start + o_r).to(gl.int64)[:, None] * heads_kv + h_k) * D + o_d[None, :]  # [BN, D]
    m_r = (o_r < len_k)[:, None]
    vinv_r = gl.convert_layout(vinv, gl.SliceLayout(1, KEY_ROWS))[:, None]
    # 2^-eK 2^(eK - eV) of dK's payload, then the softmax scale, rounded before the rotation
    # (mul_rn) as in the Triton kernel.
    b_dk = rotate(mul_rn(gl.convert_layout(acc_dk, KEY_ROWS), scale * vinv_r, False), inv_sqrt_d, ROTATE_STAGES)
    gl.store(p_dk + o_out, to_output(b_dk, p_dk.dtype.element_ty, False), mask=m_r)
    gl.store(p_dv + o_out, to_output(gl.convert_layout(acc_dv, KEY_ROWS) * vinv_r, p_dv.dtype.element_ty, False),
             mask=m_r)


def dkdv_descriptors(q_codes, do_codes, q_codes_t, dot_codes_t, records, k_codes, v_codes, block_m: int,
                     block_n: int):
    """Host TMA descriptors of the dK/dV kernel's operands in the 2-D views and blocks that
    ``dkdv_gluon_kernel`` reads: Q^, dO^ [Tq, Hq D] by [BM, D]; Q^T, dOt^T [Hq D, Tq_t] by
    [D, BM]; the query records [Hq Tq, 4] by [BM, 4] (int32, unswizzled); K^, V^ [Tk, Hkv D]
    by [BN, D]. Codes contiguous, float8_e4m3fn or bfloat16; Q^T and dOt^T None where the
    kernel reads the row codes alone (ROWS): their descriptors too."""
    d = q_codes.shape[-1]
    q, do = code_descriptors((q_codes.flatten(1), [block_m, d]), (do_codes.flatten(1), [block_m, d]))
    qt = dot = None
    if q_codes_t is not None:
        qt, dot = code_descriptors((q_codes_t.flatten(0, 1), [d, block_m]), (dot_codes_t.flatten(0, 1), [d, block_m]))
    k, v = code_descriptors((k_codes.flatten(1), [block_n, d]), (v_codes.flatten(1), [block_n, d]))
    rec = descriptor(records.flatten(0, 1), (block_m, 4), _RECORDS_SHARED)
    return q, do, qt, dot, rec, k, v


@functools.lru_cache(maxsize=None)
def query_record_layout(block_m: int):
    """The layout of a query step's [BM, 4] records in which each thread holds the 4 words of
    every query column it holds in the S^T accumulator (m64nBMk32 wgmma, 4 warps): one
    16-byte load per query, and the split fields land in that accumulator's column layout
    (``convert_layout(..., assert_trivial=True)`` checks it). Column c of the accumulator:
    bit 0 and bits 3.. from registers, bits 1-2 from lanes 0-1."""
    regs = [[0, 1], [0, 2], [1, 0]] + [[1 << b, 0] for b in range(3, block_m.bit_length() - 1)]
    return gl.DistributedLinearLayout(reg_bases=regs, lane_bases=[[2, 0], [4, 0], [0, 0], [0, 0], [0, 0]],
                                      warp_bases=[[0, 0], [0, 0]], block_bases=[], shape=[block_m, 4])
