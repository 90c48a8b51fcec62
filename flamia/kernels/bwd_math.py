"""The backward's arithmetic, shared by the Triton kernels (``attn_bwd.py``, the interpreter's
path and the reference) and the Gluon dQ kernel (``attn_dq_gluon.py``, the GPU's): document
bounds and step ranges, the visibility rule, P codes and the gradient payload of a tile
(NUMERICS.md 4), the row-scaled E4M3 codes of a payload, and the dQ epilogue. Written once so
the kernels agree bit for bit; each helper is layout-free (it creates no tensor of its own),
which lets Gluon kernels call it.
"""
import triton
import triton.language as tl

from .fp4 import e2m1_grad
from .fp8 import (E4M3_EQ, E4M3_MQ, code_grid, mul_rn, pow2, pow2_reciprocal, scale_exponent, scaled, to_e4m3,
                  to_output)
from .fwd_math import diagonal_tile, group_exponents, p4_values, p_grid, same_layout
from .hadamard import rotate
from .layout import T_ALIGN as _T_ALIGN
from .random_bits import key_key, mix32_rest, xorshift16

T_ALIGN = tl.constexpr(_T_ALIGN)  # the transposed codes' documents start at multiples of this column


@triton.jit
def query_factors(fields):
    """Per-query vectors [N] fp32 from ``records.query_fields`` (or ``query_fields_by_word``):
    (qg = 2^eQ, (m, rf = 2^(sigma - PV), rq = ro 2^(edO + eQ), deltad = delta / 2^edO)), the
    second part as ``grad_scores`` takes it. Rows past the document's end read m = +inf,
    rq = 0 and qg = rf = 1 (``query_fields``), so their P and G vanish."""
    m, rq, deltad, qg, rf = fields
    return qg, (m, rf, rq, deltad)


@triton.jit
def visible(o_i, o_k, geo):
    """Query o_i sees key o_k (broadcast positions in the document); geo = (Lq, Lk, wl, wr)
    with unbounded window sides already replaced by a large bound (masks.py semantics)."""
    len_q, len_k, wl, wr = geo
    off = len_k - len_q
    return (o_i < len_q) & (o_k < len_k) & (o_k <= o_i + off + wr) & (o_k >= o_i + off - wl)


@triton.jit
def tile_positions(o_i, o_k, Q_AXIS: tl.constexpr):
    """Query and key positions [N] broadcast to a tile's orientation: [queries, keys]
    (Q_AXIS = 0) or [keys, queries] (Q_AXIS = 1), for ``visible`` and the bounds checks."""
    if Q_AXIS == 0:
        t_i, t_k = o_i[:, None], o_k[None, :]
    else:
        t_i, t_k = o_i[None, :], o_k[:, None]
    return t_i, t_k


@triton.jit
def row_parts(p_rk, o_i, len_q):
    """The stored row parts [N] uint32 (``random_bits.grad_row_parts``, one stream) of query
    positions o_i [N] in the document, p_rk at its first row of the head; 0 past the
    document, where G is 0 and rounds to 0 whatever its word."""
    return tl.load(p_rk + o_i.to(tl.int64), mask=o_i < len_q, other=0).to(tl.uint32, bitcast=True)


@triton.jit
def grad_words(b_row, key0, o_k, Q_AXIS: tl.constexpr):
    """uint32 words [tile] that round the all-4-bit route's G stochastically (NUMERICS.md 6),
    bit for bit ``formats.random_bits.grad_bits``: b_row [N], the tile rows' ``row_parts`` of
    the stream; o_k [N] key positions in the document, whose first packed key is key0 (int64);
    broadcast as ``tile_positions``. The key part costs a product per column; each score pays
    one xor and ``mix32``'s steps after its first."""
    b_key = xorshift16(key_key(key0, o_k))  # [N] uint32
    t_row, t_key = tile_positions(b_row, b_key, Q_AXIS)
    return mix32_rest(t_row ^ t_key)


@triton.jit
def e2m1_payload(b_g, rng, o_k, Q_AXIS: tl.constexpr, GRAD4: tl.constexpr):
    """The all-4-bit route's payload (NUMERICS.md 6): fp32 [tile] G (Q_AXIS 0, dQ: random-bit
    stream 0) or G^T (Q_AXIS 1, dK: stream 1) as E2M1 values with their scales folded in
    (``fp4.e2m1_grad``), to nearest (GRAD4 1) or stochastically (2: ``grad_words`` of
    rng = (the tile rows' ``row_parts``, the document's first packed key) and key positions o_k)."""
    b_word = None
    if GRAD4 == 2:
        b_word = grad_words(rng[0], rng[1], o_k, Q_AXIS)
    return e2m1_grad(b_g, b_word, GRAD4 == 2)


@triton.jit
def forward_diagonal(i0, k0, geo, FBM: tl.constexpr, FBN: tl.constexpr):
    """Whether a backward tile from query i0 and key k0 lies in a diagonal tile of the
    forward's FBM x FBN tiles (``fwd_math.diagonal_tile``), where the mixed route kept E4M3
    P; the backward's tiles nest in the forward's (``AttnTiles`` checks it). geo: ``visible``'s."""
    len_q, len_k, wl, wr = geo
    return diagonal_tile(k0 // FBN, i0 // FBM * FBM, len_q, len_k, len_k - len_q, wl, wr, FBM, FBN)


@triton.jit
def _visible_p4(b_p, o_i, o_k, geo, Q_AXIS: tl.constexpr, MASK, TO_LAYOUT: tl.constexpr, TILE: tl.constexpr,
                GROUP_EXP: tl.constexpr):
    """4-bit P (``fwd_math.p4_values``) of b_p with group maxima over the visible keys: a
    masked key's p is not zero here, so MASK zeroes it first."""
    if MASK:
        t_i, t_k = tile_positions(o_i, o_k, Q_AXIS)
        b_p = tl.where(visible(t_i, t_k, geo), b_p, 0.0)
    return p4_values(b_p, b_p, False, 1 - Q_AXIS, TO_LAYOUT, TILE, GROUP_EXP)


@triton.jit
def grad_scores(b_s, b_dp, row_x, col_x, qry, vf, o_i, o_k, geo, Q_AXIS: tl.constexpr, MASK,
                CODES: tl.constexpr, INTERPRET: tl.constexpr, P4: tl.constexpr = 0, DIAG=True,
                TO_LAYOUT: tl.constexpr = same_layout, TILE: tl.constexpr = None, RO_IN_P: tl.constexpr = False,
                P_CODES: tl.constexpr = None, GROUP_EXP: tl.constexpr = group_exponents):
    """P codes and the gradient payload of one tile, NUMERICS.md 4 steps 1-6.

    The tile is [queries, keys] (Q_AXIS = 0, the dQ loop) or [keys, queries] (Q_AXIS = 1,
    the dK/dV loop); every product is elementwise, so one body serves both orientations.
    b_s: Q^.K^ and b_dp: dO^.V^ code products (fp32, tile shape). The scores' factors come as
    row_x [rows] (the program's own tokens' s2 2^e) and col_x [cols] (the step's 2^e, a power
    of two): x = S (row_x col_x) is the contract's (S qf) kf bit for bit, since a power of two
    applied is exact either way. qry = (m, rf, rq, deltad) of ``query_factors`` and vf = 2^eV,
    each [N]; o_i, o_k: query and key positions [N] in the document; geo: ``visible``'s;
    MASK: apply the visibility rule by selection on P and the payload (a constexpr, or a
    runtime flag in the Gluon kernels). P4 (``fwd_math.p4_values``; TO_LAYOUT, TILE and GROUP_EXP as
    there): 0 none; 1 the mixed route's 4-bit P where DIAG (the tile lies in a diagonal
    forward tile, ``fwd_math.diagonal_tile``) is false, its group maxima over the visible
    keys; 2 the leaking ablation's, on every tile with group maxima over the in-bounds keys;
    3 the all-4-bit route's, on every tile with group maxima over the visible keys.
    RO_IN_P (the bf16 recipe's dV, NUMERICS.md 4a): the P returned is P^ ro rounded to CODES,
    dV's A operand against dO^ (exponents 0, so rq is ro). P_CODES: the dtype of the P^
    returned, where dV's product takes it in another format than CODES (BF16 values of E4M3
    codes, exact: ``configs.Route.dot_values``); None: CODES.
    Returns (P^ in the operand format P_CODES, payload fp32), tile shape. With W = fp32(fp32(Pd 2^(eV + eQ)) (dP - D))
    (dS 2^(eV + eQ): NUMERICS.md 4's dS rounded at the same places), the payload is
    G = W 2^(eK - eV) in the dQ orientation and W^T in the dK/dV one, whose key factors are
    constant along its rows (the epilogue's). Powers of two scale exactly, so G has W's
    rounding. The payload is 0 where the pair is not visible."""
    if P4 == 3:
        # 4-bit P on every tile selects under MASK twice (its group maxima, then the payload),
        # and with a runtime MASK the compiler computed both selections' compares on every
        # step, masked or not: one branch around the tile keeps them on the masked steps. The
        # other routes' unmasked steps are no shorter so, and spill more (PERFORMANCE.md).
        if MASK:
            b_pc, b_g = _grad_scores(b_s, b_dp, row_x, col_x, qry, vf, o_i, o_k, geo, Q_AXIS, True, CODES,
                                     INTERPRET, P4, DIAG, TO_LAYOUT, TILE, RO_IN_P, P_CODES, GROUP_EXP)
        else:
            b_pc, b_g = _grad_scores(b_s, b_dp, row_x, col_x, qry, vf, o_i, o_k, geo, Q_AXIS, False, CODES,
                                     INTERPRET, P4, DIAG, TO_LAYOUT, TILE, RO_IN_P, P_CODES, GROUP_EXP)
    else:
        b_pc, b_g = _grad_scores(b_s, b_dp, row_x, col_x, qry, vf, o_i, o_k, geo, Q_AXIS, MASK, CODES, INTERPRET,
                                 P4, DIAG, TO_LAYOUT, TILE, RO_IN_P, P_CODES, GROUP_EXP)
    return b_pc, b_g


@triton.jit
def _grad_scores(b_s, b_dp, row_x, col_x, qry, vf, o_i, o_k, geo, Q_AXIS: tl.constexpr, MASK, CODES: tl.constexpr,
                 INTERPRET: tl.constexpr, P4: tl.constexpr, DIAG, TO_LAYOUT: tl.constexpr, TILE: tl.constexpr,
                 RO_IN_P: tl.constexpr, P_CODES: tl.constexpr, GROUP_EXP: tl.constexpr):
    """``grad_scores``' body."""
    K_AXIS: tl.constexpr = 1 - Q_AXIS
    m, rf, rq, deltad = qry
    vf = tl.expand_dims(vf, Q_AXIS)
    # x - m with x = S (row_x col_x): col_x is a power of two, so the factor is exact and the
    # fused multiply-add rounds x - m once, as the contract's (S qf) kf and subtraction do.
    # Where col_x is one value per scale block (the keys' 2^eK in dQ, ``block_key_records``;
    # a half step's queries' 2^eQ in the Gluon dK/dV) the compiler forms the factor once per
    # row and block, not per score.
    b_xm = tl.fma(b_s, scaled(row_x[:, None], col_x[None, :], CODES), -tl.expand_dims(m, K_AXIS))
    b_p = tl.math.exp2(b_xm)
    if P4 == 2:
        b_src = b_xm
        if MASK:  # group maxima over the in-bounds keys, masked or not; P over the visible ones
            t_i, t_k = tile_positions(o_i, o_k, Q_AXIS)
            b_src = tl.where((t_i < geo[0]) & (t_k < geo[1]), b_xm, float("-inf"))
            b_p = tl.where(visible(t_i, t_k, geo), b_p, 0.0)
        b_p = p4_values(b_p, b_src, True, K_AXIS, TO_LAYOUT, TILE, GROUP_EXP)
    elif P4 == 1:
        if not DIAG:  # one branch per step: tiles of diagonal forward tiles keep E4M3 P
            b_p = _visible_p4(b_p, o_i, o_k, geo, Q_AXIS, MASK, TO_LAYOUT, TILE, GROUP_EXP)
    elif P4 == 3:
        b_p = _visible_p4(b_p, o_i, o_k, geo, Q_AXIS, MASK, TO_LAYOUT, TILE, GROUP_EXP)
    # Pd comes from the fp32 value on the E4M3 grid, not from converting the fp8 codes back:
    # Triton 3.6 converts an fp8 tensor that also feeds a wgmma as its A operand to fp32 as
    # garbage (NaN dK, different from run to run).
    # The V fold as one multiply by vf rf: one value per query and key block, which the
    # compiler computes once per block; the same codes as the forward's (p vf) rf (NUMERICS.md 4).
    b_pcf = p_grid(b_p * (vf * tl.expand_dims(rf, K_AXIS)), CODES, P4, INTERPRET)
    # ((P^ ro)((dP 2^edO) vf - D)) 2^eQ with 2^edO and 2^eQ moved onto ro and D (records.query_records)
    if Q_AXIS == 0:
        # dQ: G = W 2^(eK - eV), the key's powers of two folded into rq: one factor per row
        # and 32-key block, not a product per score; exact, so the same bits as W's product.
        b_rq = rq[:, None] * (col_x[None, :] * pow2_reciprocal(vf))
    else:
        b_rq = rq[None, :]
    b_pd = b_pcf * b_rq
    b_g = b_pd * (b_dp * vf - tl.expand_dims(deltad, K_AXIS))
    if RO_IN_P:
        b_pcf = code_grid(b_pd, CODES, INTERPRET)
    if MASK:
        # Masked by selection, never by a product: a masked step reaches rows or keys of the
        # next document, whose codes and records may be NaN (0 x NaN = NaN would cross it).
        t_i, t_k = tile_positions(o_i, o_k, Q_AXIS)
        m_vis = visible(t_i, t_k, geo)
        b_pcf = tl.where(m_vis, b_pcf, 0.0)
        b_g = tl.where(m_vis, b_g, 0.0)
    if P_CODES is None:
        b_pc = b_pcf.to(CODES)
    else:  # exact: the values lie on CODES' grid (E4M3 inside BF16)
        b_pc = b_pcf.to(P_CODES)
    return b_pc, b_g


@triton.jit
def row_scaled_codes(b_g, INTERPRET: tl.constexpr):
    """E4M3 codes of G 2^-e and the fp32 factors 2^e [R], one exponent per row of b_g [R, C]
    fp32, e = scale_exponent(rowmax |G|): the A operand of the dQ payload's product (rows =
    queries) and of dK's (rows = keys), whose results the kernels scale by 2^e per row.
    (BF16 payloads take no scale: the kernels round them with ``to_codes``.)"""
    e = scale_exponent(tl.max(tl.abs(b_g), axis=1), E4M3_EQ, E4M3_MQ)  # [R]
    return to_e4m3(b_g * pow2(-e)[:, None], INTERPRET), pow2(e)


@triton.jit
def step_range(u0, len_u, len_v, c, w_lo, w_hi, BU: tl.constexpr, BV: tl.constexpr):
    """Steps of BV positions (counted from the document start) along v that meet the tile
    [u0, u0 + BU) along u (u0 < len_u), where u sees v iff u + c - w_lo <= v <= u + c + w_hi
    and 0 <= v < len_v. Returns step indices (lo, hi, full_lo, full_hi): steps lo <= j < hi
    meet the tile; in [full_lo, full_hi) every pair is visible and both the tile and the step
    lie inside the document, so unmasked loads and math never touch positions past its end."""
    v_min = tl.maximum(u0 + c - w_lo, 0)
    v_end = tl.minimum(tl.minimum(u0 + BU, len_u) + c + w_hi, len_v)
    lo = v_min // BV
    hi = tl.where(v_end > v_min, tl.cdiv(v_end, BV), lo)
    full_lo = tl.minimum(tl.maximum(tl.cdiv(tl.maximum(u0 + BU - 1 + c - w_lo, 0), BV), lo), hi)
    # full steps also end before the first pair out of sight: v0 + BV - 1 <= u0 + c + w_hi
    full_end = tl.minimum(u0 + c + w_hi + 1, len_v)
    full_hi = tl.minimum(tl.maximum(tl.maximum(full_end, 0) // BV, full_lo), hi)
    full_hi = tl.where(u0 + BU <= len_u, full_hi, full_lo)
    return lo, hi, full_lo, full_hi


@triton.jit
def masked_step(t, lo, full_lo, full_hi):
    """The t-th step that needs the mask: [lo, full_lo) then [full_hi, hi)."""
    return tl.where(t < full_lo - lo, lo + t, full_hi + (t - (full_lo - lo)))


@triton.jit
def doc_bounds(p_cu, p_cu_t, doc):
    """(first row int64, length int32, first transposed column int64, span int32) of document
    doc on one side (queries or keys): the column is a multiple of T_ALIGN (``layout.py``),
    and the span, the length rounded up to T_ALIGN, bounds the document's columns."""
    start = tl.load(p_cu + doc)
    length = tl.load(p_cu + doc + 1) - start
    start_t = tl.multiple_of(tl.load(p_cu_t + doc), T_ALIGN)
    return start.to(tl.int64), length, start_t.to(tl.int64), tl.cdiv(length, T_ALIGN) * T_ALIGN


@triton.jit
def store_dq(p_dq, acc, rows, o_d, m_r, h_q, heads_q, scale, inv_sqrt_d, ROTATE_STAGES: tl.constexpr,
             INTERPRET: tl.constexpr):
    """dQ of packed rows ``rows`` [BM] (int64, masked by m_r) of query head h_q from its fp32
    sum of payloads acc [BM, D] (o_d [D]: 0..D-1 in acc's column layout), already times 2^-eQ:
    times the softmax scale, rotated back when ROTATE_STAGES > 0, stored in p_dq's dtype
    ([Tq, Hq, D])."""
    o_out = (rows * heads_q + h_q)[:, None] * o_d.shape[0] + o_d[None, :]  # [BM, D]
    b_dq = rotate(mul_rn(acc, scale, INTERPRET), inv_sqrt_d, ROTATE_STAGES)  # [BM, D]
    tl.store(p_dq + o_out, to_output(b_dq, p_dq.dtype.element_ty, INTERPRET), mask=m_r[:, None])
