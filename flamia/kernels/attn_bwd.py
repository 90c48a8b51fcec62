"""The Triton backward of the MXFP8, BF16 and mixed NVFP4 routes (NUMERICS.md 4, 6): a dK/dV
kernel and a dQ kernel, on the codes' format (``CODES``: E4M3, or BF16 with every exponent 0;
the mixed route's Q and K score codes are BF16 beside E4M3, and ``P4`` rebuilds its 4-bit P).

Both kernels recompute, for every (query, key) pair, the forward's scores and P codes relative
to the saved final row max, then the gradient payload G, in the order NUMERICS.md fixes; only
fp32 summation order differs from ``flamia/reference/emulated.py``. By default neither uses
atomics (``AttnTiles.dq_atomic`` moves dQ into the dK/dV kernel, see ``_dq_atomic_add``):
- dK/dV: a program per (key tile of ``bwd_block_n`` keys, document, KV head) loops over the
  query heads of its GQA group and the query steps of ``bwd_block_m`` rows that see the tile.
  Its tiles are [keys, queries] (S^T = K^ Q^T), so P^T and G^T, the A operands of
  dV += P^T dOt^ and dK += G^T Q^, come out of the softmax in place without a transpose.
- dQ: a program per (query tile of ``dq_block_m`` rows, document, query head) loops over the
  key steps of ``dq_block_n`` keys that the tile sees.
Programs come from a ``worklist.tile_list`` (only tiles that hold tokens; long documents
first). Tiles and steps start at document starts. Steps whose pairs are all visible run the same
body as the others with the mask (and the masked loads) compiled out.
Hopper's FP8 MMA needs K-major operands, hence the transposed inputs: dK reads Q^T, dQ reads
K^T and dV reads dOt^T, with tokens contiguous and every document starting at a multiple of
32 columns (layout.py), so their tiles load as 16-byte vectors.
On the GPU, dQ and dK/dV run in Gluon (attn_dq_gluon.py, attn_dkdv_gluon.py); both equal these
kernels bit for bit.
"""
import math

import torch
import triton
import triton.language as tl

from ..formats.hadamard import HADAMARD_DIMS
from ..masks import effective_window
from ..validation import INPUT_DTYPES
from .configs import BF16, E4M3, SUPPORTED_HEAD_DIMS, AttnTiles, format_of
from .attn_dkdv_gluon import dkdv_descriptors, dkdv_gluon_kernel, query_record_layout
from .attn_dq_gluon import dq_descriptors, dq_gluon_kernel
from .bwd_math import (doc_bounds, forward_diagonal, grad_scores, grad_words, masked_step, query_factors,
                       row_parts, row_scaled_codes, step_range, store_dq)
from .fp4 import e2m1_grad
from .fp8 import interpreting, maybe_masked_load, mma, mul_rn, pow2, pow2_reciprocal, to_codes, to_output
from .hadamard import rotate
from .layout import check_operand, mma_token_order, transposed_extent
from .records import block_key_records, key_records, query_fields, query_records, record_factors
from .worklist import list_extent, program_tile, tile_list
from .launch import PACKING_INTS, cdiv, launch
from .random_bits import grad_row_parts

LOG2E = math.log2(math.e)


@triton.jit
def _load_rows(p, o_t, m_t, stride, D: tl.constexpr, MASK: tl.constexpr):
    """[N, D] codes of tokens o_t [N] of a row-major [T, H, D] tensor (p at the document's
    first token and the head; stride = H * D)."""
    o_x = o_t.to(tl.int64)[:, None] * stride + tl.arange(0, D)[None, :]  # [N, D]
    return maybe_masked_load(p + o_x, m_t[:, None], 0.0, MASK)


@triton.jit
def _load_cols(p, o_t, span, stride, D: tl.constexpr, MASK: tl.constexpr):
    """[D, N] codes of tokens o_t [N] of a transposed [H, D, T_t] tensor (p at the head and
    the document's first column; stride = T_t). Masked loads stop at ``span``, the document's
    length rounded up to T_ALIGN: its columns past the end hold zero codes, and a bound that
    is a multiple of T_ALIGN keeps the mask constant over 16-byte vectors."""
    o_x = tl.arange(0, D).to(tl.int64)[:, None] * stride + o_t[None, :]  # [D, N]
    return maybe_masked_load(p + o_x, (o_t < span)[None, :], 0.0, MASK)


@triton.jit
def _add_row_scaled_mma(acc, b_g, b_op, CODES: tl.constexpr, INTERPRET: tl.constexpr, GRAD4: tl.constexpr = 0,
                        b_word=None):
    """acc + (e4m3(G 2^-e) @ op) 2^e with one exponent per row of G (``row_scaled_codes``):
    the dQ payload (rows = queries) and the dK payload (rows = keys). BF16 payloads take no
    scale, so their product accumulates into acc inside the MMA (``chain_mma``). GRAD4 1 or
    2: the all-4-bit route's E2M1 G with its scales folded in (``fp4.e2m1_grad``, nearest or
    stochastic from the random words b_word [R, C]), which accumulates the same way. b_g:
    [R, C] fp32, b_op: [C, D] codes, acc: [R, D] fp32."""
    if GRAD4 > 0:
        b_gv = to_codes(e2m1_grad(b_g, b_word, GRAD4 == 2), CODES, INTERPRET)  # exact in BF16
        acc = mma(mma_token_order(b_gv, CODES), b_op, acc, INTERPRET)
    elif CODES == tl.bfloat16:
        acc = mma(mma_token_order(to_codes(b_g, CODES, INTERPRET), CODES), b_op, acc, INTERPRET)
    else:
        b_gc, b_f = row_scaled_codes(b_g, INTERPRET)
        b_zero = tl.zeros([b_g.shape[0], b_op.shape[1]], dtype=tl.float32)
        acc += mma(mma_token_order(b_gc, CODES), b_op, b_zero, INTERPRET) * b_f[:, None]
    return acc


@triton.jit
def _dq_atomic_add(p_dqa, b_gt, b_kt, qinv, o_i, m_i, heads_q, D: tl.constexpr, CODES: tl.constexpr,
                   INTERPRET: tl.constexpr):
    """dQ's share of one (key tile, query step) pair, added to the fp32 accumulator with
    atomics: the dQ payload of the dQ kernel's ``_add_row_scaled_mma`` (one exponent per query
    over the key tile), computed as dQ^T = K^T G^T so that the MMA's M is D, not the query
    step. G^T is transposed in fp32 first, so its fp8 codes reach the MMA as a K-major
    operand without an fp8 transpose. b_gt: [BN, BM] fp32 G^T; b_kt: [D, BN] K^T codes; qinv:
    [BM] 2^-eQ, left out of the sum as the dQ kernel's epilogue leaves it (``_dq_kernel``);
    p_dqa: fp32 [Tq, Hq, D] at the document's first row and the query head."""
    b_g = tl.trans(b_gt)  # [BM, BN]
    if CODES == tl.bfloat16:  # BF16 payloads take no scale
        b_gc = to_codes(b_g, CODES, INTERPRET)  # [BM, BN]
    else:
        b_gc, b_f = row_scaled_codes(b_g, INTERPRET)  # [BM, BN], [BM]
        qinv = b_f * qinv
    b_zero = tl.zeros([D, b_g.shape[0]], dtype=tl.float32)
    b_dqt = mma(b_kt, tl.trans(mma_token_order(b_gc, CODES)), b_zero, INTERPRET) * qinv[None, :]  # [D, BM]
    o_dq = o_i.to(tl.int64)[None, :] * (heads_q * D) + tl.arange(0, D)[:, None]  # [D, BM]
    tl.atomic_add(p_dqa + o_dq, b_dqt, mask=m_i[None, :], sem="relaxed")


@triton.jit
def _dkdv_step(acc_dk, acc_dv, b_k, b_v, b_kt, key, o_k, i0, p_rows, p_cols, p_rec, p_dote, p_dqa, geo, span_q,
               heads_q, tq_t, diag, rng, D: tl.constexpr, BM: tl.constexpr,
               MASK: tl.constexpr, DQ_ATOMIC: tl.constexpr, CODES: tl.constexpr, P4: tl.constexpr,
               GRAD4: tl.constexpr, ROWS: tl.constexpr, DOT_CODES: tl.constexpr, INTERPRET: tl.constexpr):
    """One query step [i0, i0 + BM) of a key tile: adds its dK payload (without its keys'
    2^(eK - eV): W^T of ``grad_scores``) and its dV payload to acc_dk, acc_dv [BN, D], and with
    DQ_ATOMIC its dQ payload to p_dqa (``_dq_atomic_add``; b_kt [D, BN] K^T codes). b_k,
    b_v: [BN, D] codes; key: (s2 kf, kf, vf, vinv) [BN], the tile's key factors and the scores'
    row factor; o_k: [BN] key
    positions; p_rows = (Q^, dO^) row-major and p_cols = (Q^T, dOt^T) transposed (row stride
    tq_t), p_rec as ``query_factors``, p_dote (dot_exps) and p_dqa: all at the document's
    first row (column) and the head; span_q: the document's transposed span (``doc_bounds``);
    diag: the step lies in a diagonal forward tile (``forward_diagonal``; P4 only); GRAD4 and
    rng: the all-4-bit route's G (``_add_row_scaled_mma``; rng = (the dK stream's row parts at
    the document's first row, its first packed key), ``bwd_math.row_parts``). ROWS (the bf16
    recipe, NUMERICS.md 4a): dK = G^T Q^ and dV = bf16(P^ ro)^T dO^ on the row codes; p_cols
    is None. DOT_CODES: dOt^'s format; BF16 beside E4M3 CODES holds the codes' values times
    their 2^edOt (``configs.Route.dot_values``), so dV's product runs on BF16 P^ and
    accumulates inside the MMA."""
    p_q, p_do = p_rows
    o_i = i0 + tl.arange(0, BM)  # [BM] query positions
    m_i = o_i < geo[0]
    b_q = _load_rows(p_q, o_i, m_i, heads_q * D, D, MASK)  # [BM, D]
    b_do = _load_rows(p_do, o_i, m_i, heads_q * D, D, MASK)  # [BM, D]
    # dK's and dV's B operands [BM, D]; rows past the document load as zeros under MASK, as the
    # transposed codes hold them
    if ROWS:
        b_qb, b_dob = b_q, b_do
    else:
        p_qt, p_dott = p_cols
        b_qb = tl.trans(_load_cols(p_qt, o_i, span_q, tq_t, D, MASK))
        b_dob = tl.trans(_load_cols(p_dott, o_i, span_q, tq_t, D, MASK))
    qg, qry = query_factors(query_fields(p_rec, o_i, m_i, MASK))
    if DOT_CODES == tl.float8e4nv:
        # dOt^ has one exponent per query step: read it at the step's first row (inside the
        # document). BF16 dOt^ carries its own (0 for BF16 codes).
        e_dot = tl.load(p_dote + tl.cast(i0, tl.int64) * heads_q).to(tl.int32)
    b_zero = tl.zeros([b_k.shape[0], BM], dtype=tl.float32)
    b_st = mma(b_k, tl.trans(b_q), b_zero, INTERPRET)  # [BN, BM] S^T
    b_dpt = mma(b_v, tl.trans(b_do), b_zero, INTERPRET)  # [BN, BM] dP^T before its factors
    b_pct, b_wt = grad_scores(b_st, b_dpt, key[0], qg, qry, key[2], o_i, o_k, geo, 1, MASK, CODES, INTERPRET,
                              P4=P4, DIAG=diag, RO_IN_P=ROWS, P_CODES=DOT_CODES)
    if DOT_CODES == tl.float8e4nv:
        b_dv = mma(mma_token_order(b_pct, DOT_CODES), b_dob, tl.zeros_like(acc_dv), INTERPRET)  # [BN, D]
        acc_dv += b_dv * pow2(e_dot)
    else:  # BF16: no step exponent, so the product accumulates inside the MMA
        acc_dv = mma(mma_token_order(b_pct, DOT_CODES), b_dob, acc_dv, INTERPRET)
    # dK's payload rows are keys: 2^eK and 2^-eV are constant along a row, the epilogue's.
    b_word = None
    if GRAD4 == 2:
        b_word = grad_words(row_parts(rng[0], o_i, geo[0]), rng[1], o_k, 1)  # [BN, BM]
    acc_dk = _add_row_scaled_mma(acc_dk, b_wt, b_qb, CODES, INTERPRET, GRAD4,
                                 b_word)  # W^T is G^T 2^(eV - eK)
    if DQ_ATOMIC:  # dQ's payload G, whose query's 2^eQ the atomic sum leaves out
        _dq_atomic_add(p_dqa, b_wt * (key[1] * key[3])[:, None], b_kt, pow2_reciprocal(qg), o_i, m_i, heads_q, D,
                       CODES, INTERPRET)
    return acc_dk, acc_dv


@triton.jit(do_not_specialize=PACKING_INTS)
def _dkdv_kernel(p_q, p_qt, p_k, p_kt, p_v, p_do, p_dott, p_dote, p_rec, p_krec, p_cu_q, p_cu_k, p_cu_qt,
                 p_cu_kt, p_work, width, p_dk, p_dv, p_dqa, s2, scale, inv_sqrt_d, wl, wr, total_q, total_k, heads_q,
                 tq_t, tk_t, p_rk,
                 GROUP: tl.constexpr, D: tl.constexpr, BM: tl.constexpr,
                 BN: tl.constexpr, SCALE_BLOCK: tl.constexpr, ROTATE_STAGES: tl.constexpr, DQ_ATOMIC: tl.constexpr,
                 CODES: tl.constexpr, P4: tl.constexpr, FBM: tl.constexpr, FBN: tl.constexpr,
                 GRAD4: tl.constexpr, ROWS: tl.constexpr, DOT_CODES: tl.constexpr, INTERPRET: tl.constexpr):
    """Program ((document, key tile), KV head): dK and dV [BN, D] of the tile, summed over
    the query heads of its GQA group, stored in p_dk's dtype (dK rotated back when
    ROTATE_STAGES > 0); with DQ_ATOMIC, also the tile's dQ payloads, added to the fp32
    accumulator p_dqa [Tq, Hq, D] (p_kt, tk_t: K^T codes; unused otherwise). The work list
    (``worklist.tile_list``) puts long documents first and, in each, tile 0: under a causal
    mask it sees the most queries. GRAD4: ``_add_row_scaled_mma``'s, with p_rk the dK stream's
    ``random_bits.grad_row_parts`` [Hq, Tq] (None unless GRAD4 is 2); ROWS and DOT_CODES:
    ``_dkdv_step``'s."""
    doc, tile = program_tile(p_work, width)
    if doc < 0:
        return
    h_k = tl.program_id(1).to(tl.int64)
    heads_kv = heads_q // GROUP
    q_start, len_q, q_start_t, span_q = doc_bounds(p_cu_q, p_cu_qt, doc)
    k_start, len_k, k_start_t, span_k = doc_bounds(p_cu_k, p_cu_kt, doc)
    k0 = tile * BN
    geo = (len_q, len_k, wl, wr)
    o_k = k0 + tl.arange(0, BN)  # [BN] key positions
    m_k = o_k < len_k
    o_kv = (k_start * heads_kv + h_k) * D  # the document's first K, V, dK, dV row of this head
    b_k = _load_rows(p_k + o_kv, o_k, m_k, heads_kv * D, D, True)  # [BN, D]
    b_v = _load_rows(p_v + o_kv, o_k, m_k, heads_kv * D, D, True)  # [BN, D]
    # [BN] 2^eK, 2^eV, a word per scale block (keys past the document: masked steps only)
    kf, vf = record_factors(block_key_records(p_krec + h_k * total_k + k_start, k0, tl.arange(0, BN),
                                              total_k - k_start, SCALE_BLOCK, BN))
    key = (s2 * kf, kf, vf, pow2_reciprocal(vf))  # s2 rides on the key's factor, fixed for the whole tile
    b_kt = b_k  # a placeholder the steps ignore unless DQ_ATOMIC
    if DQ_ATOMIC:
        if ROWS:  # K^'s rows hold K^T's values (zeros past the document, as loaded)
            b_kt = tl.trans(b_k)  # [D, BN]
        else:
            b_kt = _load_cols(p_kt + h_k * D * tk_t + k_start_t, o_k, span_k, tk_t, D, True)  # [D, BN]
    # Key k is seen by the queries i with k - off - wr <= i <= k - off + wl.
    lo, hi, full_lo, full_hi = step_range(k0, len_k, len_q, len_q - len_k, wr, wl, BN, BM)
    acc_dk = tl.zeros([BN, D], dtype=tl.float32)
    acc_dv = tl.zeros([BN, D], dtype=tl.float32)
    for g in range(GROUP):
        h_q = h_k * GROUP + g
        o_qd = (q_start * heads_q + h_q) * D
        o_qt = h_q * D * tq_t + q_start_t
        o_qe = q_start * heads_q + h_q
        p_rows = (p_q + o_qd, p_do + o_qd)
        p_cols = None if ROWS else (p_qt + o_qt, p_dott + o_qt)
        p_rec_h = p_rec + (h_q * total_q + q_start) * 4
        p_dqa_h = p_dqa + o_qd
        rng = (p_rk, k_start)  # p_rk: None unless GRAD4 == 2
        if GRAD4 == 2:
            rng = (p_rk + h_q * total_q + q_start, k_start)
        for j in range(full_lo, full_hi):
            acc_dk, acc_dv = _dkdv_step(acc_dk, acc_dv, b_k, b_v, b_kt, key, o_k, j * BM, p_rows, p_cols, p_rec_h,
                                        p_dote + o_qe, p_dqa_h, geo, span_q, heads_q, tq_t,
                                        forward_diagonal(j * BM, k0, geo, FBM, FBN), rng, D, BM,
                                        False, DQ_ATOMIC, CODES, P4, GRAD4, ROWS, DOT_CODES, INTERPRET)
        for t in range(0, (full_lo - lo) + (hi - full_hi)):
            i0 = masked_step(t, lo, full_lo, full_hi) * BM
            acc_dk, acc_dv = _dkdv_step(acc_dk, acc_dv, b_k, b_v, b_kt, key, o_k, i0, p_rows, p_cols, p_rec_h,
                                        p_dote + o_qe, p_dqa_h, geo, span_q, heads_q, tq_t,
                                        forward_diagonal(i0, k0, geo, FBM, FBN), rng, D, BM,
                                        True, DQ_ATOMIC, CODES, P4, GRAD4, ROWS, DOT_CODES, INTERPRET)
    o_out = o_kv + o_k.to(tl.int64)[:, None] * (heads_kv * D) + tl.arange(0, D)[None, :]  # [BN, D]
    # [BN, D]: 2^-eK 2^(eK - eV) of the payload, times the softmax scale, then rotated back
    b_dk = rotate(mul_rn(acc_dk, (scale * key[3])[:, None], INTERPRET), inv_sqrt_d, ROTATE_STAGES)
    tl.store(p_dk + o_out, to_output(b_dk, p_dk.dtype.element_ty, INTERPRET), mask=m_k[:, None])
    tl.store(p_dv + o_out, to_output(acc_dv * key[3][:, None], p_dv.dtype.element_ty, INTERPRET), mask=m_k[:, None])


@triton.jit
def _dq_step(acc, b_q, b_do, qx, qry, o_i, k0, p_rows, p_kt, p_krec, n_k, geo, span_k, heads_kv, tk_t, diag, diag_k,
             rng,
             D: tl.constexpr, BN: tl.constexpr, SCALE_BLOCK: tl.constexpr, MASK: tl.constexpr,
             CODES: tl.constexpr, P4: tl.constexpr, GRAD4: tl.constexpr, ROWS: tl.constexpr,
             INTERPRET: tl.constexpr):
    """One key step [k0, k0 + BN) of a query tile: acc [BM, D] += its dQ payload. b_q, b_do:
    [BM, D] codes; qx: the scores' row factor s2 2^eQ and qry: ``query_factors``'s second
    part, [BM]; o_i: [BM] query positions; p_rows = (K^, V^)
    row-major, p_kt K^T transposed (row stride tk_t) and p_krec (``key_records``, read once per
    scale block of SCALE_BLOCK keys, ``block_key_records``; n_k: the keys it holds from there):
    all at the document's first key (column) and the KV head; span_k: the document's transposed
    span; diag: the step lies in a diagonal forward tile (``forward_diagonal``; P4 only). GRAD4
    and rng: the all-4-bit route's G (``_add_row_scaled_mma``; rng = (the tile rows' parts of
    the dQ stream, the document's first packed key), ``grad_words``); its steps on
    diagonal dQ tiles (diag_k) read K^T with per-key scales: p_kt = (K^T, that K^T) there.
    ROWS (the bf16 recipe): dQ = G K^ on the row codes; p_kt is None."""
    p_k, p_v = p_rows
    o_k = k0 + tl.arange(0, BN)  # [BN] key positions
    m_k = o_k < geo[1]
    b_k = _load_rows(p_k, o_k, m_k, heads_kv * D, D, MASK)  # [BN, D]
    b_v = _load_rows(p_v, o_k, m_k, heads_kv * D, D, MASK)  # [BN, D]
    b_word = None
    if GRAD4 > 0:
        p_kt, p_ktd = p_kt
        if diag_k:
            p_kt = p_ktd
        if GRAD4 == 2:
            b_word = grad_words(rng[0], rng[1], o_k, 0)  # [BM, BN]
    if ROWS:  # keys past the document load as zeros under MASK, as the transposed codes hold them
        b_kb = b_k
    else:
        b_kb = tl.trans(_load_cols(p_kt, o_k, span_k, tk_t, D, MASK))  # [BN, D]
    # Keys past the document (masked steps only) take a neighbour's factors: their P and G are 0.
    kf, vf = record_factors(block_key_records(p_krec, k0, tl.arange(0, BN), n_k, SCALE_BLOCK, BN))
    b_zero = tl.zeros([b_q.shape[0], BN], dtype=tl.float32)
    b_s = mma(b_q, tl.trans(b_k), b_zero, INTERPRET)  # [BM, BN] S
    b_dp = mma(b_do, tl.trans(b_v), b_zero, INTERPRET)  # [BM, BN] dP before its factors
    _, b_g = grad_scores(b_s, b_dp, qx, kf, qry, vf, o_i, o_k, geo, 0, MASK, CODES, INTERPRET,
                         P4=P4, DIAG=diag)  # [BM, BN] payload G
    return _add_row_scaled_mma(acc, b_g, b_kb, CODES, INTERPRET, GRAD4, b_word)


@triton.jit(do_not_specialize=PACKING_INTS)
def _dq_kernel(p_q, p_k, p_kt, p_v, p_do, p_rec, p_krec, p_cu_q, p_cu_k, p_cu_qt, p_cu_kt, p_work, width, p_dq,
               s2, scale,
               inv_sqrt_d, wl, wr, total_q, total_k, heads_q, tk_t, p_ktd, p_rk, GROUP: tl.constexpr,
               D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, SCALE_BLOCK: tl.constexpr,
               ROTATE_STAGES: tl.constexpr, CODES: tl.constexpr, P4: tl.constexpr, FBM: tl.constexpr,
               FBN: tl.constexpr, GRAD4: tl.constexpr, ROWS: tl.constexpr, INTERPRET: tl.constexpr):
    """Program ((document, query tile), query head): dQ [BM, D] of the tile in p_dq's dtype
    (rotated back when ROTATE_STAGES > 0). The work list puts long documents first and, in
    each, the last tile: under a causal mask it sees the most keys. GRAD4 (``_dq_step``'s):
    p_ktd, K^T with per-key scales laid out as p_kt, and p_rk, the dQ stream's
    ``random_bits.grad_row_parts`` [Hq, Tq] (None unless GRAD4 is 2); ROWS: ``_dq_step``'s."""
    doc, tile = program_tile(p_work, width)
    if doc < 0:
        return
    h_q = tl.program_id(1).to(tl.int64)
    heads_kv = heads_q // GROUP
    h_k = h_q // GROUP
    q_start, len_q, _, _ = doc_bounds(p_cu_q, p_cu_qt, doc)
    k_start, len_k, k_start_t, span_k = doc_bounds(p_cu_k, p_cu_kt, doc)
    i0 = tile * BM
    geo = (len_q, len_k, wl, wr)
    o_i = i0 + tl.arange(0, BM)  # [BM] query positions
    m_i = o_i < len_q
    o_qd = (q_start * heads_q + h_q) * D
    b_q = _load_rows(p_q + o_qd, o_i, m_i, heads_q * D, D, True)  # [BM, D]
    b_do = _load_rows(p_do + o_qd, o_i, m_i, heads_q * D, D, True)  # [BM, D]
    qg, qry = query_factors(query_fields(p_rec + (h_q * total_q + q_start) * 4, o_i, m_i, True))
    qx = s2 * qg  # s2 rides on the query's factor, fixed for the whole tile
    o_kv = (k_start * heads_kv + h_k) * D
    p_rows = (p_k + o_kv, p_v + o_kv)
    o_kt = h_k * D * tk_t + k_start_t
    p_kt_doc = None if ROWS else p_kt + o_kt
    if GRAD4 > 0:
        p_kt_doc = (p_kt_doc, p_ktd + o_kt)
    rng = (p_rk, k_start)  # the tile rows' parts of G's random words, where GRAD4 == 2
    if GRAD4 == 2:
        rng = (row_parts(p_rk + h_q * total_q + q_start, o_i, len_q), k_start)
    p_krec_doc = p_krec + h_k * total_k + k_start
    # Query i sees the keys k with i + off - wl <= k <= i + off + wr.
    lo, hi, full_lo, full_hi = step_range(i0, len_q, len_k, len_k - len_q, wl, wr, BM, BN)
    acc = tl.zeros([BM, D], dtype=tl.float32)
    for j in range(full_lo, full_hi):
        acc = _dq_step(acc, b_q, b_do, qx, qry, o_i, j * BN, p_rows, p_kt_doc, p_krec_doc, total_k - k_start, geo,
                       span_k, heads_kv, tk_t, forward_diagonal(i0, j * BN, geo, FBM, FBN),
                       forward_diagonal(i0, j * BN, geo, BM, BN), rng, D, BN, SCALE_BLOCK,
                       False, CODES, P4, GRAD4, ROWS, INTERPRET)
    for t in range(0, (full_lo - lo) + (hi - full_hi)):
        k0 = masked_step(t, lo, full_lo, full_hi) * BN
        acc = _dq_step(acc, b_q, b_do, qx, qry, o_i, k0, p_rows, p_kt_doc, p_krec_doc, total_k - k_start, geo,
                       span_k, heads_kv, tk_t, forward_diagonal(i0, k0, geo, FBM, FBN),
                       forward_diagonal(i0, k0, geo, BM, BN), rng, D, BN, SCALE_BLOCK,
                       True, CODES, P4, GRAD4, ROWS, INTERPRET)
    # 2^-eQ of dQ's code scale, exact before the softmax scale's one rounding (NUMERICS.md 4)
    acc = acc * pow2_reciprocal(qg)[:, None]
    store_dq(p_dq, acc, q_start + o_i, tl.arange(0, D), m_i, h_q, heads_q, scale, inv_sqrt_d, ROTATE_STAGES, INTERPRET)


@triton.jit
def _dq_finish_kernel(p_dqa, p_dq, scale, inv_sqrt_d, total_q, heads_q, D: tl.constexpr, BM: tl.constexpr,
                      ROTATE_STAGES: tl.constexpr, INTERPRET: tl.constexpr):
    """Program (block of BM packed rows, query head): dQ from the atomics' fp32 sums p_dqa
    [Tq, Hq, D] (``AttnTiles.dq_atomic``), as the dQ kernel's epilogue stores it."""
    h_q = tl.program_id(1).to(tl.int64)
    rows = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)  # [BM]
    m_r = rows < total_q
    o_acc = (rows * heads_q + h_q)[:, None] * D + tl.arange(0, D)[None, :]  # [BM, D]
    acc = tl.load(p_dqa + o_acc, mask=m_r[:, None], other=0.0)
    store_dq(p_dq, acc, rows, tl.arange(0, D), m_r, h_q, heads_q, scale, inv_sqrt_d, ROTATE_STAGES, INTERPRET)


def attention_backward(q_codes, q_codes_t, q_exps, k_codes, k_codes_t, k_exps, v_codes, v_exps, do_codes, do_exps,
                       dot_codes_t, dot_exps, delta, m, ro, pv, cu_seqlens_q, cu_seqlens_k, cu_seqlens_q_t, cu_seqlens_k_t,
                       *, causal: bool, window_size: tuple[int, int], softmax_scale: float,
                       sigma: int, scale_block: int, tiles: AttnTiles, rotate: bool = False,
                       out_dtype: torch.dtype = torch.float32,
                       key_rec: torch.Tensor | None = None, records: torch.Tensor | None = None,
                       dkdv_work: torch.Tensor | None = None, dq_work: torch.Tensor | None = None,
                       p4: int = 0, grad4: int = 0, k_codes_t_diag: torch.Tensor | None = None,
                       seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV of the MXFP8 or BF16 route (NUMERICS.md 4), with dQ and dK rotated back by the
    Hadamard transform when ``rotate`` (Q and K were rotated), in the kernels' epilogues. The
    mixed NVFP4 route (NUMERICS.md 6): q_codes and k_codes are its bfloat16 score codes, every
    other code E4M3, and p4 rebuilds the forward's 4-bit P (``configs.p4_mode``: 1 off its
    diagonal tiles, 2 on every tile with group maxima over masked keys too). The all-4-bit route
    (NUMERICS.md 6): bfloat16 codes throughout with every scale folded in (exponents 0), p4 = 3
    (or 2), grad4 (``configs.grad_mode``: G to E2M1 in groups of 16, 1 nearest, 2 stochastic
    from the random words of ``seed``) and k_codes_t_diag: K^T with one power-of-two scale per key,
    laid out as k_codes_t, which the diagonal dQ tiles multiply instead (``tiles.dq_atomic``
    False).

    Codes are float8_e4m3fn (MXFP8) or bfloat16 (BF16, every exponent 0), one dtype (but
    dot_codes_t may be bfloat16 beside E4M3 codes: the codes' values times their 2^edOt, which
    dV multiplies in BF16, ``configs.Route.dot_values``): q_codes,
    do_codes [Tq, Hq, D]; k_codes, v_codes [Tk, Hkv, D]; q_codes_t, dot_codes_t [Hq, D, Tq_t] and
    k_codes_t [Hkv, D, Tk_t] (tokens contiguous in the layout of ``layout.py``, zero codes outside
    documents; None on the bf16 recipe's route, ``Route.rows``, whose kernels read the row
    codes instead, NUMERICS.md 4a). Exponents int8: q_exps, do_exps, dot_exps [Tq, Hq]
    (dot_exps constant over each query step of ``tiles.bwd_block_m`` rows from the document
    start); k_exps, v_exps [Tk, Hkv]; BF16 Q and K codes may come without exponents (q_exps,
    k_exps None: the bf16 route's own bf16 inputs), then with records and key_rec.
    delta, m, ro: [Hq, Tq] fp32 (m = +inf and ro = 0 on rows that see no key); pv: [Tq, Hkv] int32;
    cu_seqlens_q/k: int32 [num_docs + 1], with cu_seqlens_*[-1] = T (rows outside every document
    are not written); cu_seqlens_q_t/k_t: int32 [num_docs + 1], the transposed codes' document
    starts (``aligned_starts``, as the quantizers return them). D is 64 or 128 and Hq a multiple of
    Hkv. scale_block: the tokens that share an exponent (32, or 1 for per-token exponents; K's
    blocks start at document starts). key_rec: ``key_records(k_exps, v_exps)`` [Hkv, Tk] int32 if
    the caller has it (the forward's), else built here; records, the same for
    ``query_records(q_exps, do_exps, pv, m, ro, delta, sigma)`` [Hq, Tq, 4] int32 (the dO
    quantizer's); dkdv_work and dq_work, the same for the kernels' ``tile_list``s
    (``plan.build_plan``'s "dkdv" and "dq").
    Returns dq [Tq, Hq, D], dk and dv [Tk, Hkv, D] in ``out_dtype`` (fp32, bf16 or fp16,
    rounded to nearest even from the fp32 values: the rotate-back and the cast happen before
    the store, where a separate torch pass would read and write every gradient several times).
    Nothing is read back to the host, so the launches can be captured in a CUDA graph."""
    tq, hq, d = q_codes.shape
    tk, hkv = k_codes.shape[:2]
    if d not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"q_codes: head dim must be one of {SUPPORTED_HEAD_DIMS}, got {d}")
    if k_codes.dim() != 3 or hkv == 0 or hq % hkv:
        raise ValueError(f"k_codes: expected [Tk, Hkv, D] with Hq={hq} a multiple of Hkv, got {tuple(k_codes.shape)}")
    if out_dtype not in INPUT_DTYPES:  # the gradients take the inputs' dtype
        raise ValueError(f"out_dtype: must be one of {INPUT_DTYPES}, got {out_dtype}")
    if scale_block not in (1, 32):
        raise ValueError(f"scale_block: must be 1 or 32, got {scale_block}")
    if rotate and d not in HADAMARD_DIMS:
        raise ValueError(f"rotate: the Hadamard rotation needs head dim in {HADAMARD_DIMS}, got {d}")
    num_docs = cu_seqlens_q.shape[0] - 1
    tq_t, tk_t = transposed_extent(tq, num_docs), transposed_extent(tk, num_docs)
    fmt, scores = format_of(v_codes), format_of(q_codes)
    codes, i8, i32 = fmt.torch_dtype, torch.int8, torch.int32
    # the bf16 recipe's dK/dV and dQ read the row codes (NUMERICS.md 4a); the all-4-bit route's
    # transposed codes are grouped along tokens, so they hold other values
    rows = fmt == BF16 and not grad4
    # dOt^ as BF16 values of E4M3 codes (``configs.Route.dot_values``): dV's product in BF16
    dot = BF16 if fmt == E4M3 and dot_codes_t is not None and dot_codes_t.dtype == torch.bfloat16 else fmt
    for name, x in (("q_codes_t", q_codes_t), ("k_codes_t", k_codes_t), ("dot_codes_t", dot_codes_t)):
        if (x is None) != rows:
            raise ValueError(f"{name}: None on the bf16 route (its kernels read the row codes), a tensor on the "
                             f"others; got {'None' if x is None else 'a tensor'} with {codes} codes, grad4={grad4}")
    if p4 and ((fmt != E4M3 and not grad4) or tiles.diag_block_n % tiles.bwd_block_n
               or tiles.fwd_block_m % tiles.bwd_block_m or tiles.fwd_block_m % tiles.dq_block_m
               or tiles.diag_block_n % tiles.dq_block_n):
        raise ValueError(f"p4: 4-bit P needs E4M3 codes or the all-4-bit route's (got {codes}, grad4={grad4}) and "
                         f"backward tiles that nest in the forward's (got {tiles})")
    if grad4 not in (0, 1, 2):
        raise ValueError(f"grad4: 0, 1 (E2M1 G, nearest) or 2 (stochastic), got {grad4}")
    if grad4 and (fmt != BF16 or k_codes_t_diag is None or p4 not in (2, 3) or tiles.dq_atomic
                  or min(tiles.bwd_block_m, tiles.dq_block_n) % 16):
        raise ValueError(f"grad4: the all-4-bit route takes bfloat16 codes (got {codes}), k_codes_t_diag, 4-bit P "
                         f"on every tile (p4 2 or 3, got {p4}) and a dQ kernel on steps of 16 (got {tiles})")
    transposed = [] if rows else [("q_codes_t", q_codes_t, codes, (hq, d, tq_t)),
                                  ("k_codes_t", k_codes_t, codes, (hkv, d, tk_t)),
                                  ("dot_codes_t", dot_codes_t, dot.torch_dtype, (hq, d, tq_t))]
    exps = [("q_exps", q_exps, i8, (tq, hq), records), ("k_exps", k_exps, i8, (tk, hkv), key_rec)]
    for name, x, _, _, built in exps:
        if x is None and (scores != BF16 or built is None):
            raise ValueError(f"{name}: None only for BF16 Q and K codes (got {scores.name}) with "
                             f"{'records' if name == 'q_exps' else 'key_rec'} given")
    for name, x, dtype, shape in (
            *transposed, ("q_codes", q_codes, scores.torch_dtype, (tq, hq, d)),
            ("k_codes", k_codes, scores.torch_dtype, (tk, hkv, d)),
            *(e[:4] for e in exps if e[1] is not None),
            ("v_codes", v_codes, codes, (tk, hkv, d)), ("v_exps", v_exps, i8, (tk, hkv)),
            ("do_codes", do_codes, codes, (tq, hq, d)), ("do_exps", do_exps, i8, (tq, hq)),
            ("dot_exps", dot_exps, i8, (tq, hq)),
            ("delta", delta, torch.float32, (hq, tq)), ("m", m, torch.float32, (hq, tq)),
            ("ro", ro, torch.float32, (hq, tq)), ("pv", pv, i32, (tq, hkv)),
            ("cu_seqlens_q", cu_seqlens_q, i32, (num_docs + 1,)), ("cu_seqlens_k", cu_seqlens_k, i32, (num_docs + 1,)),
            ("cu_seqlens_q_t", cu_seqlens_q_t, i32, (num_docs + 1,)),
            ("cu_seqlens_k_t", cu_seqlens_k_t, i32, (num_docs + 1,)),
            *([("k_codes_t_diag", k_codes_t_diag, codes, (hkv, d, tk_t))] if grad4 else [])):
        check_operand(name, x, dtype, shape)
    if grad4 == 2 and not 0 <= seed < 1 << 64:
        raise ValueError(f"seed: must be in [0, 2^64), got {seed}")
    dev = q_codes.device
    dq = torch.empty((tq, hq, d), dtype=out_dtype, device=dev)
    dk, dv = (torch.empty((tk, hkv, d), dtype=out_dtype, device=dev) for _ in range(2))
    if min(tq, tk, num_docs) == 0:  # no query sees a key: every gradient is zero
        return dq.zero_(), dk.zero_(), dv.zero_()
    wl, wr = effective_window(causal, window_size)
    # An unbounded side becomes a bound no pair reaches, so one visibility rule serves all masks.
    unbounded = tq + tk
    wl, wr = (w if w >= 0 else unbounded for w in (wl, wr))
    args = dict(s2=softmax_scale * LOG2E, scale=softmax_scale, inv_sqrt_d=1.0 / math.sqrt(d), wl=wl, wr=wr,
                total_q=tq, total_k=tk, heads_q=hq, GROUP=hq // hkv, D=d,
                ROTATE_STAGES=d.bit_length() - 1 if rotate else 0, CODES=fmt.codes, P4=p4, FBM=tiles.fwd_block_m,
                FBN=tiles.diag_block_n, INTERPRET=interpreting())
    # the all-4-bit route's G rounding: each kernel's stream of the rows' random-word parts
    parts = grad_row_parts(seed, hq, tq, dev) if grad4 == 2 else (None, None)
    dq_rounding, dkdv_rounding = (dict(p_rk=part, GRAD4=grad4) for part in parts)
    # dq_atomic: the dK/dV kernel adds every dQ payload into an fp32 [Tq, Hq, D] buffer
    # (zeroed here, inside the captured call), which one more pass scales and stores.
    dq_sums = torch.zeros((tq, hq, d), dtype=torch.float32, device=dev) if tiles.dq_atomic else dq
    if dkdv_work is None:
        dkdv_work = tile_list(cu_seqlens_k, tk, tiles.bwd_block_n, reverse=False)
    check_operand("dkdv_work", dkdv_work, i32, (2, list_extent(tk, num_docs, tiles.bwd_block_n)))
    if records is None:
        records = query_records(q_exps, do_exps, pv, m, ro, delta, sigma)
    check_operand("records", records, i32, (hq, tq, 4))
    if key_rec is None:
        key_rec = key_records(k_exps, v_exps)
    check_operand("key_rec", key_rec, i32, (hkv, tk))
    gluon_args = {k: v for k, v in args.items() if k != "INTERPRET"} | {"SCORE_CODES": scores.codes}
    grid = (dkdv_work.shape[1], hkv)
    if tiles.dkdv_gluon and not interpreting():
        descs = dkdv_descriptors(q_codes, do_codes, q_codes_t, dot_codes_t, records, k_codes, v_codes,
                                 tiles.bwd_block_m, tiles.bwd_block_n)
        launch(dkdv_gluon_kernel, grid, *descs, dot_exps, key_rec, cu_seqlens_q, cu_seqlens_k, cu_seqlens_q_t,
               cu_seqlens_k_t, dkdv_work, dkdv_work.shape[1], dk, dv, BM=tiles.bwd_block_m, BN=tiles.bwd_block_n,
               SCALE_BLOCK=scale_block, STAGES=tiles.bwd_stages, REC_L=query_record_layout(32),
               ROWS=rows, DOT_CODES=dot.codes, num_warps=tiles.bwd_warps, maxnreg=tiles.dkdv_maxnreg, **gluon_args,
               **dkdv_rounding)
    else:
        launch(_dkdv_kernel, grid, q_codes, q_codes_t, k_codes, k_codes_t, v_codes, do_codes, dot_codes_t, dot_exps,
               records, key_rec, cu_seqlens_q, cu_seqlens_k, cu_seqlens_q_t, cu_seqlens_k_t, dkdv_work,
               dkdv_work.shape[1], dk, dv, dq_sums, tq_t=tq_t, tk_t=tk_t, BM=tiles.bwd_block_m, BN=tiles.bwd_block_n,
               SCALE_BLOCK=scale_block, DQ_ATOMIC=tiles.dq_atomic, ROWS=rows, DOT_CODES=dot.codes,
               num_warps=tiles.bwd_warps, num_stages=tiles.bwd_stages, **args, **dkdv_rounding)
    if tiles.dq_atomic:
        grid = (cdiv(tq, tiles.dq_block_m), hq)
        # the dQ kernel's epilogue constants, from the same dict
        epilogue = {name: args[name] for name in ("scale", "inv_sqrt_d", "total_q", "heads_q", "D", "ROTATE_STAGES",
                                                  "INTERPRET")}
        launch(_dq_finish_kernel, grid, dq_sums, dq, BM=tiles.dq_block_m, **epilogue)
        return dq, dk, dv
    if dq_work is None:
        dq_work = tile_list(cu_seqlens_q, tq, tiles.dq_block_m, reverse=True)
    check_operand("dq_work", dq_work, i32, (2, list_extent(tq, num_docs, tiles.dq_block_m)))
    grid = (dq_work.shape[1], hq)
    if tiles.dq_gluon and not interpreting():
        *descs, ktd_desc = dq_descriptors(q_codes, do_codes, k_codes, v_codes, k_codes_t, tiles.dq_block_m,
                                          tiles.dq_block_n, k_codes_t_diag if grad4 else None)
        launch(dq_gluon_kernel, grid, *descs, records, key_rec, cu_seqlens_q, cu_seqlens_k, cu_seqlens_q_t,
               cu_seqlens_k_t, dq_work, dq_work.shape[1], dq, ktd_desc=ktd_desc, BM=tiles.dq_block_m,
               BN=tiles.dq_block_n, SCALE_BLOCK=scale_block, STAGES=tiles.dq_stages, ROWS=rows,
               num_warps=tiles.dq_warps, **gluon_args, **dq_rounding)
        return dq, dk, dv
    launch(_dq_kernel, grid, q_codes, k_codes, k_codes_t, v_codes, do_codes, records, key_rec, cu_seqlens_q,
           cu_seqlens_k, cu_seqlens_q_t, cu_seqlens_k_t, dq_work, dq_work.shape[1], dq, tk_t=tk_t,
           p_ktd=k_codes_t_diag, BM=tiles.dq_block_m, BN=tiles.dq_block_n, SCALE_BLOCK=scale_block, ROWS=rows,
           num_warps=tiles.dq_warps, num_stages=tiles.dq_stages, **args, **dq_rounding)
    return dq, dk, dv
