"""The forward's arithmetic, shared by the Triton kernel (``attn_fwd.py``, the interpreter's
path and the reference) and the Gluon kernel (``attn_fwd_gluon.py``, the GPU's): the program's
geometry, each row's visible keys, NUMERICS.md 3's steps after Q^ K^T on a tile of scores, and the
epilogue's row statistics. Written once, so the two kernels agree bit for bit. Each helper is
layout-free (it creates no tensor of its own), which lets Gluon kernels call it.
"""
import math

import triton
import triton.language as tl

from ..formats.bitexp import SCHRAUDOLPH_OFFSET
from .fp4 import E2M1_EQ, E2M1_MQ, round_e2m1_at, round_int
from .fp8 import code_grid, pow2, pow2_reciprocal, scale_exponent, scaled, to_codes
from .layout import T_ALIGN

LN2 = tl.constexpr(math.log(2.0))
V_ALIGN = tl.constexpr(T_ALIGN)  # V^T: every document starts at a multiple of this many columns
P_GROUP = tl.constexpr(32)  # keys of a row sharing one power-of-two scale of 4-bit P
_SCHRAUDOLPH_OFFSET = tl.constexpr(SCHRAUDOLPH_OFFSET)


@triton.jit
def program_geometry(doc, tile, p_cu_q, p_cu_k, p_cu_kt, heads_q, heads_kv, window_left, window_right,
                     BM: tl.constexpr, BN: tl.constexpr):
    """The scalars of the program of query tile ``tile`` of document ``doc`` and query head
    program_id(1), shared by the Triton and the Gluon forwards: h, hk, the document's
    q_start, len_q, len_k, k_start, k_start_t (its first V^T column), i0 (the tile's first query),
    the offset and window sides (off, wl, wr; unbounded sides become bounds no pair can
    reach, so one rule serves all masks), and the key tiles [t_lo, t_hi) that meet some
    row's visible keys, of which [u_lo, u_hi) are visible to every row."""
    h = tl.program_id(1)
    hk = h // (heads_q // heads_kv)
    q_start = tl.load(p_cu_q + doc)
    len_q = tl.load(p_cu_q + doc + 1) - q_start
    k_start = tl.load(p_cu_k + doc)
    len_k = tl.load(p_cu_k + doc + 1) - k_start
    # The document's first V^T column: aligned, so V^T tiles load as 16-byte vectors.
    k_start_t = tl.multiple_of(tl.load(p_cu_kt + doc), V_ALIGN)
    i0 = tile * BM
    off = len_k - len_q
    wl = tl.where(window_left < 0, len_k, window_left)
    wr = tl.where(window_right < 0, len_q + len_k, window_right)
    # The first (i0) and the last stored row (i1) bound the tiles' runs.
    i1 = tl.minimum(i0 + BM, len_q) - 1
    end0 = tl.maximum(tl.minimum(i0 + off + wr + 1, len_k), 0)  # one past a row's last key
    end1 = tl.maximum(tl.minimum(i1 + off + wr + 1, len_k), 0)
    t_lo = tl.maximum(i0 + off - wl, 0) // BN
    t_hi = tl.maximum(tl.cdiv(end1, BN), t_lo)
    u_lo = tl.minimum(tl.maximum(tl.cdiv(tl.maximum(i1 + off - wl, 0), BN), t_lo), t_hi)
    u_hi = tl.minimum(tl.maximum(end0 // BN, u_lo), t_hi)
    return h, hk, q_start, len_q, len_k, k_start, k_start_t, i0, off, wl, wr, t_lo, u_lo, u_hi, t_hi


@triton.jit
def query_factors(p_qe, o_row, m_row, heads_q, h, s2, CODES: tl.constexpr):
    """qf = s2 2^eQ [BM] fp32 of packed query rows o_row (where m_row) of head h, from Q's
    exponents p_qe [Tq, Hq] int8; BF16 codes carry none (every exponent 0, NUMERICS.md 4a), so
    they read nothing and p_qe may be None."""
    if CODES == tl.bfloat16:
        b_qf = s2 + m_row.to(tl.float32) * 0.0
    else:
        b_qf = s2 * pow2(tl.load(p_qe + o_row * heads_q + h, mask=m_row, other=0).to(tl.int32))
    return b_qf


@triton.jit
def visible_keys(o_m, off, wl, wr, len_k):
    """Each row's visible keys [first, last] (NUMERICS.md 3) of query positions o_m [BM]
    (``program_geometry``'s off, wl, wr); last < first: the row sees none."""
    return o_m + off - wl, tl.minimum(o_m + off + wr, len_k - 1)


@triton.jit
def diagonal_tile(t, i0, len_q, len_k, off, wl, wr, BM: tl.constexpr, BN: tl.constexpr):
    """Whether key tile t of the query tile at row i0 holds a masked pair of a real query and a
    real key (``program_geometry``'s off, wl, wr): NUMERICS.md 6's diagonal tiles, where the
    mixed route keeps E4M3 P. The tiles a program visits all hold visible pairs, and the
    rows' visible ranges move right with the row: a masked pair exists where the last row
    hides the tile's first key or the first row hides its last real key."""
    i1 = tl.minimum(i0 + BM, len_q) - 1
    k_last = tl.minimum((t + 1) * BN, len_k) - 1
    return (t * BN < i1 + off - wl) | (k_last > i0 + off + wr)


@triton.jit
def group_exponent(b_max, LOG_SRC: tl.constexpr):
    """``scale_exponent(gmax, 6)`` (int32) of 4-bit P groups whose maxima are b_max: gmax is
    b_max, or with LOG_SRC exp2 of it."""
    if LOG_SRC:
        b_max = tl.exp2(b_max)
    return scale_exponent(b_max, E2M1_EQ, E2M1_MQ)


@triton.jit
def group_exponents(b_src, AXIS: tl.constexpr, LOG_SRC: tl.constexpr):
    """``group_exponent`` of the groups along AXIS of b_src (fp32, 3-D: the keys of each group
    on AXIS), kept as a size-1 AXIS. ``p4_values``' GROUP_EXP where no faster one is given."""
    return tl.expand_dims(group_exponent(tl.max(b_src, AXIS), LOG_SRC), AXIS)


@triton.jit
def p4_values(b_p, b_src, LOG_SRC: tl.constexpr, K_AXIS: tl.constexpr, TO_LAYOUT: tl.constexpr,
              LAYOUT: tl.constexpr, GROUP_EXP: tl.constexpr = group_exponents):
    """4-bit P before the V fold (NUMERICS.md 6) of b_p [R, C] fp32 (>= 0, 0 on masked keys,
    keys along K_AXIS in groups of 32 from the document start): ``e2m1(p 2^-eg) 2^eg`` with
    ``eg = scale_exponent(gmax, 6)`` per (query, 32 keys), in b_p's layout (TO_LAYOUT(x,
    LAYOUT), as ``scores_to_codes``' TO_ROWS). gmax is the group max of b_src [R, C]: of p
    itself (b_src = b_p, the contract), or with LOG_SRC of x - m (-inf where no key counts),
    gmax = exp2 of the max, as the leaking ablation takes it over in-bounds keys. GROUP_EXP
    computes eg (``group_exponents``' arguments and result): a Gluon kernel may pass one that
    shares the work among its threads."""
    R: tl.constexpr = b_p.shape[0]
    C: tl.constexpr = b_p.shape[1]
    if K_AXIS == 1:  # [queries, keys]
        b_g = tl.reshape(b_p, [R, C // P_GROUP, P_GROUP])
        b_src = tl.reshape(b_src, [R, C // P_GROUP, P_GROUP])
    else:  # [keys, queries]
        b_g = tl.reshape(b_p, [R // P_GROUP, P_GROUP, C])
        b_src = tl.reshape(b_src, [R // P_GROUP, P_GROUP, C])
    b_eg = GROUP_EXP(b_src, K_AXIS + 1, LOG_SRC)  # [R, C / 32, 1] or [R / 32, 1, C]
    return TO_LAYOUT(tl.reshape(round_e2m1_at(b_g, b_eg), [R, C]), LAYOUT)


@triton.jit
def p_grid(b_pf, CODES: tl.constexpr, P4: tl.constexpr, INTERPRET: tl.constexpr):
    """The folded P values b_pf on the grid of CODES (``fp8.code_grid``), exact fp32. With 4-bit
    P on every tile (P4 2 or 3) in BF16 codes they are already there: E2M1 values times powers
    of two, two significant bits within BF16's (fp32's) exponents, so the rounding is skipped."""
    if CODES == tl.bfloat16 and P4 >= 2:
        b_grid = b_pf
    else:
        b_grid = code_grid(b_pf, CODES, INTERPRET)
    return b_grid


@triton.jit
def schraudolph_exp2(x):
    """``formats.bitexp.schraudolph_exp2`` (the ``fwd_approx_exp`` ablation's forward): x in
    fixed point with 7 fraction bits, written into a BF16 pattern, centred by the offset;
    0 where the pattern would leave the normal range. Each step as the torch one rounds, and
    x * 128 is exact, so a contracted multiply-add rounds alike."""
    b = round_int((x + 127.0) * 128.0 + _SCHRAUDOLPH_OFFSET)
    bits = tl.minimum(tl.maximum(b, 0.0), 255.0 * 128.0 - 1.0).to(tl.int32) << 16
    return tl.where(b >= 128.0, bits.to(tl.float32, bitcast=True), 0.0)


@triton.jit
def finish_rows(b_l, b_m, b_pv, SIGMA: tl.constexpr):
    """The epilogue's row statistics (fp32 [BM] each): ro = 2^(PV - sigma) / l, lse in natural
    log, m; rows that saw no key get ro = 0 (so O = 0) and lse = m = +inf. l is 0 on a row
    that saw keys only with p4_sum_quantized when every 4-bit weight it used flushed to zero
    (the leaking ablation's group scales): its acc is 0 too, and it divides by 1, as the
    emulator does, so O = 0 instead of 0 / 0. A NaN l (a non-finite operand) stays NaN."""
    m_valid = b_m > float("-inf")
    b_l = tl.where(m_valid & (b_l != 0), b_l, 1.0)
    b_ro = tl.where(m_valid, tl.math.div_rn(pow2(b_pv - SIGMA), b_l), 0.0)
    b_lse = tl.where(m_valid, (b_m + tl.log2(b_l)) * LN2, float("inf"))
    return b_ro, b_lse, tl.where(m_valid, b_m, float("inf"))


@triton.jit
def same_layout(x, LAYOUT: tl.constexpr):
    """``scores_to_codes``' TO_ROWS for the Triton kernel: its layouts are the compiler's."""
    return x


@triton.jit
def _row_tree(x, IS_MAX: tl.constexpr, LEAVES: tl.constexpr):
    """x [R, C] folded in halves along its columns down to [R, LEAVES] (max or sum of the
    halves): each thread's part of a row then reduces as a tree of independent operations,
    where a plain row reduction runs one dependent chain; C and LEAVES powers of two."""
    R: tl.constexpr = x.shape[0]
    C: tl.constexpr = x.shape[1]
    if C > LEAVES:
        x = tl.reshape(x, [R, 2, C // 2])
        if IS_MAX:
            x = tl.max(x, 1)
        else:
            x = tl.sum(x, 1)
        x = _row_tree(x, IS_MAX, LEAVES)
    return x


@triton.jit
def scores_to_codes(b_y, b_qf, b_vf, b_rf, b_l, b_m, o_n, b_first, b_last, TAU: tl.constexpr, MASK,
                    CODES: tl.constexpr, INTERPRET: tl.constexpr, TO_ROWS: tl.constexpr = same_layout,
                    ROWS: tl.constexpr = None, P4: tl.constexpr = 0, DIAG=True, TILE: tl.constexpr = None,
                    ROW_SUM: tl.constexpr = 0, n_k=0, APPROX_EXP: tl.constexpr = False,
                    SUM_BLOCK: tl.constexpr = 1, BLOCK_SUMS: tl.constexpr = None, SUMS_ARG=None):
    """NUMERICS.md 3's steps 1 (after the product) to 6 on one tile of key-scaled scores
    b_y = (Q^ K^T) * kf[None, :] [BM, BN] fp32 (the caller's multiply, so that a kernel may
    free the product's registers before its next product): the query factors, the mask
    (MASK, a constexpr or a runtime flag: rows see keys o_n [BN] in [b_first, b_last] [BM]),
    the integer running max, exp2, the row sum, the P^ codes with the V fold. Shared by the
    Triton and the Gluon forwards, so their codes agree bit for bit. P4 (``p4_values``): 0 none;
    1 the mixed route's 4-bit P where DIAG (``diagonal_tile``) is false; 2 the leaking
    ablation's, on every tile with group maxima over the document's n_k keys, masked or not;
    3 the all-4-bit route's, on every tile.
    ROW_SUM (``configs.row_sum_mode``): l adds 0 p, 1 the 4-bit values (``p4_sum_quantized``),
    2 the values of the codes without the V fold (``p_sum_codes``): with SUM_BLOCK > 1 (the keys
    that share vf, from the document's first: E4M3 codes' V scale block) summed per block by
    BLOCK_SUMS(b_pf, b_vf, SUMS_ARG, SUM_BLOCK, CODES, INTERPRET) -> (P^ codes, block sums
    [BM, NB], 1 / vf per block [NB]) (``attn_fwd.block_sums``; the Gluon forward's, an MMA),
    else per key. APPROX_EXP: P from Schraudolph's exponential
    (``fwd_approx_exp``). TILE: b_y's layout for TO_ROWS (Gluon).
    Returns (P^ [BM, BN] in the operand format CODES, alpha [BM], l [BM], m [BM])."""
    # x = (S qf) kf of NUMERICS.md 3, in another order with the same bits: qf and kf are
    # powers of two, so y = S kf and y qf are exact, max(x) = qf max(y), and exp2's argument
    # y qf - m is one fused multiply-add (one multiply per score fewer).
    b_y_in = b_y  # the leaking ablation's group maxima see the keys the mask hides
    if MASK:
        m_vis = (o_n[None, :] >= b_first[:, None]) & (o_n[None, :] <= b_last[:, None])  # [BM, BN]
        b_y = tl.where(m_vis, b_y, float("-inf"))
    b_mx = TO_ROWS(tl.max(_row_tree(b_y, True, 8), 1), ROWS) * b_qf  # [BM]
    b_m_new = tl.where(b_mx > b_m + TAU, tl.ceil(b_mx), b_m)
    # Rows that have seen no key keep m = -inf and acc = l = 0: subtracting 0 instead keeps
    # NaN out of exp2 (their p is exp2(-inf) = 0 and alpha cannot change acc or l).
    b_m_ref = tl.where(b_m_new == float("-inf"), 0.0, b_m_new)
    b_alpha = tl.exp2(b_m - b_m_ref)                                # exact power of two
    if APPROX_EXP:
        b_p = schraudolph_exp2(tl.fma(b_y, b_qf[:, None], -b_m_ref[:, None]))  # [BM, BN]
    else:
        b_p = tl.exp2(tl.fma(b_y, b_qf[:, None], -b_m_ref[:, None]))  # [BM, BN]
    if ROW_SUM == 0:  # l adds p, before the V fold: summed here, p's registers go to the 4-bit P
        b_l = b_l * b_alpha + TO_ROWS(tl.sum(_row_tree(b_p, False, 8), 1), ROWS)
    if P4 == 2:
        b_src = tl.fma(b_y_in, b_qf[:, None], -b_m_ref[:, None])  # x - m
        if MASK:
            b_src = tl.where(o_n[None, :] < n_k, b_src, float("-inf"))
        b_p = p4_values(b_p, b_src, True, 1, TO_ROWS, TILE)
    elif P4 == 1:
        if not DIAG:  # one branch per tile: the diagonal tiles keep E4M3 P
            b_p = p4_values(b_p, b_p, False, 1, TO_ROWS, TILE)
    elif P4 == 3:  # every tile; p is 0 on masked keys, so the group maxima see the visible ones
        b_p = p4_values(b_p, b_p, False, 1, TO_ROWS, TILE)
    if ROW_SUM == 1:
        b_l = b_l * b_alpha + TO_ROWS(tl.sum(_row_tree(b_p, False, 8), 1), ROWS)
    # (p vf) rf as the contract writes it: the backward's p (vf rf) would make vf rf inf on a
    # hidden key (eV - PV reaches 220 there) and its p = 0 a NaN code (NUMERICS.md 4).
    b_pf = scaled(b_p, b_vf[None, :], CODES) * b_rf[:, None]  # [BM, BN]
    if ROW_SUM == 2 and SUM_BLOCK > 1:
        # The codes' values summed per block of keys that share vf (exact, in any order), the
        # V fold undone per block, the blocks added in halves: the order BLOCK_SUMS' callers share.
        b_pq, b_sums, b_vinv = BLOCK_SUMS(b_pf, b_vf, SUMS_ARG, SUM_BLOCK, CODES, INTERPRET)  # [BM, NB], [NB]
        b_used = tl.sum(_row_tree(b_sums * b_vinv[None, :], False, 1), 1)  # [BM]
        b_l = b_l * b_alpha + TO_ROWS(b_used, ROWS) * pow2_reciprocal(b_rf)
    else:
        if ROW_SUM == 2:  # per key (per-token V exponents, BF16 codes): the codes' values, the V fold undone
            b_pf = p_grid(b_pf, CODES, P4, INTERPRET)
            b_used = scaled(b_pf, pow2_reciprocal(b_vf)[None, :], CODES)  # [BM, BN]
            b_l = b_l * b_alpha + TO_ROWS(tl.sum(_row_tree(b_used, False, 8), 1), ROWS) * pow2_reciprocal(b_rf)
        b_pq = to_codes(b_pf, CODES, INTERPRET)  # [BM, BN]
    return b_pq, b_alpha, b_l, b_m_new
