"""The Triton forward of the MXFP8, BF16 and mixed NVFP4 routes (NUMERICS.md 3, 6), on packed
documents.

Programs map to ((document, query tile), query head) through the grid (W, Hq) and a
``worklist.tile_list``: long documents first and, in each, the last tile (under a causal mask
it sees the most keys); only tiles that hold queries get a program. Query tiles of BM rows and
key tiles of BN keys start at the document start, as in the emulator, so the integer running
max rises at the same places. A program visits only the key tiles that intersect its visible
range, in ascending order, and masks only the tiles that hold both visible and hidden pairs
(window edges, the diagonal, the document's end): one tile body, ``_attend_tile``, serves
both kinds through its ``MASK`` constexpr. On the GPU, ``attention_forward`` launches the
Gluon kernel of ``attn_fwd_gluon.py`` instead (``AttnTiles.fwd_gluon``), which computes the
same outputs bit for bit with asynchronous MMAs; this kernel is the interpreter's path and
the reference the GPU tests hold it to.

Nothing is read back to the host, so the launch can be captured in a CUDA graph.
``cu_seqlens_q[-1]`` must equal Tq (rows outside every document are not written).
"""
import math

import torch
import triton
import triton.language as tl

from ..masks import effective_window
from .attn_fwd_gluon import attn_fwd_gluon_kernel, operand_descriptors
from .configs import BF16, E4M3, AttnTiles, format_of
from .fp8 import (code_grid, interpreting, maybe_masked_load, mma, pow2, pow2_reciprocal, scaled, to_codes,
                  to_output)
from .fwd_math import diagonal_tile, finish_rows, program_geometry, query_factors, scores_to_codes, visible_keys
from .layout import check_operand, mma_token_order, transposed_extent
from .records import key_records, packed_key_factors
from .worklist import list_extent, program_tile, tile_list
from .launch import PACKING_INTS, launch
from ..validation import INPUT_DTYPES

LOG2E = math.log2(math.e)
HEAD_DIMS = (64, 128)


@triton.jit
def block_sums(b_pf, b_vf, SUMS_ARG, SUM_BLOCK: tl.constexpr, CODES: tl.constexpr, INTERPRET: tl.constexpr):
    """``fwd_math.scores_to_codes``' BLOCK_SUMS on the CUDA cores: (the E4M3 codes of the folded
    b_pf [BM, BN] fp32, the sums of their values per SUM_BLOCK keys [BM, BN / SUM_BLOCK] fp32,
    1 / vf of each block [BN / SUM_BLOCK] from b_vf [BN], its first key's: the block's keys
    past the document read other words, and their codes are 0). The sums are exact: a block
    holds at most 32 codes on one V scale, multiples of 2^-9 below 2^9, so every partial sum
    fits fp32's 24 bits and any order gives the Gluon forward's MMA sums. SUMS_ARG: unused
    (the Gluon forward's operand)."""
    BM: tl.constexpr = b_pf.shape[0]
    BN: tl.constexpr = b_pf.shape[1]
    b_grid = code_grid(b_pf, CODES, INTERPRET)
    b_sums = tl.sum(tl.reshape(b_grid, [BM, BN // SUM_BLOCK, SUM_BLOCK]), 2)  # [BM, NB]
    first = tl.arange(0, SUM_BLOCK)[None, :] == 0
    b_vinv = tl.sum(tl.where(first, tl.reshape(pow2_reciprocal(b_vf), [BN // SUM_BLOCK, SUM_BLOCK]), 0.0), 1)
    return to_codes(b_grid, CODES, INTERPRET), b_sums, b_vinv


@triton.jit
def _attend_tile(b_q, b_qf, b_rf, b_acc, b_l, b_m, p_k, p_vt, p_vtd, p_krec, k_lo, b_first, b_last,
                 n_k, n_vt, heads_kv, tk_t, diag, len_k,
                 TAU: tl.constexpr, D: tl.constexpr, BN: tl.constexpr, MASK: tl.constexpr,
                 CODES: tl.constexpr, P4: tl.constexpr, ROW_SUM: tl.constexpr, SUM_BLOCK: tl.constexpr,
                 APPROX_EXP: tl.constexpr, ALL4: tl.constexpr, INTERPRET: tl.constexpr):
    """One key tile, steps 1-7 of NUMERICS.md 3. p_k, p_vt, p_krec point at the
    document's first key (K^ row, V^T column, ``key_records``); k_lo: the tile's first key position
    in the document; b_first, b_last [BM]: each row's visible keys (MASK tiles only);
    n_k, n_vt: keys that K^ and V^T hold from the document's first one (load bounds);
    tk_t: V^T's row stride; diag: whether the tile is diagonal (``diagonal_tile``; P4 and
    ALL4 only); len_k: the document's keys. ALL4: the all-4-bit route, whose diagonal tiles
    read V^T with per-key scales from p_vtd (laid out as p_vt).
    Returns the updated (acc [BM, D], l [BM], m [BM])."""
    o_n = k_lo + tl.arange(0, BN)                                   # [BN] key positions
    o_d = tl.arange(0, D)
    o_tok = o_n.to(tl.int64)
    m_k = o_n < n_k
    # Key-indexed loads: unmasked tiles lie inside their document; in masked tiles the mask
    # keeps the load inside the *tensor* only: keys past the document are finite codes (the
    # next document's, or V^T's zero columns) whose P is zero. V^T's bound and its document
    # start, multiples of 16, keep the mask constant over 16-byte vectors.
    b_k = maybe_masked_load(p_k + o_tok[:, None] * (heads_kv * D) + o_d[None, :], m_k[:, None], 0.0, MASK)  # [BN, D]
    if ALL4:
        if diag:
            p_vt = p_vtd
    p_vt_tile = p_vt + o_d[:, None].to(tl.int64) * tk_t + o_tok[None, :]
    b_vt = maybe_masked_load(p_vt_tile, (o_n < n_vt)[None, :], 0.0, MASK)  # [D, BN]
    b_kf, b_vf = packed_key_factors(p_krec, o_n, m_k, MASK)         # [BN] fp32 2^eK, 2^eV

    b_s = mma(b_q, tl.trans(b_k), tl.zeros([b_q.shape[0], BN], tl.float32), INTERPRET)  # [BM, BN]
    b_y = scaled(b_s, b_kf[None, :], CODES)  # [BM, BN]
    b_pq, b_alpha, b_l, b_m_new = scores_to_codes(b_y, b_qf, b_vf, b_rf, b_l, b_m, o_n, b_first, b_last, TAU, MASK,
                                                  CODES, INTERPRET, P4=P4, DIAG=diag, ROW_SUM=ROW_SUM, n_k=len_k,
                                                  APPROX_EXP=APPROX_EXP, SUM_BLOCK=SUM_BLOCK, BLOCK_SUMS=block_sums)
    if CODES == tl.bfloat16:
        # BF16 MMAs accumulate in full fp32: P^ V^ adds into the rescaled acc inside the MMA.
        b_acc = mma(mma_token_order(b_pq, CODES), tl.trans(b_vt), b_acc * b_alpha[:, None], INTERPRET)
    else:
        # P^ V^ starts from zero and is added in fp32: Hopper's FP8 MMA accumulates with reduced
        # precision, which over a whole row of key tiles cost 0.4% of O against the emulator.
        b_tile_o = mma(mma_token_order(b_pq, CODES), tl.trans(b_vt), tl.zeros_like(b_acc), INTERPRET)  # [BM, D]
        b_acc = b_acc * b_alpha[:, None] + b_tile_o
    return b_acc, b_l, b_m_new


@triton.jit(do_not_specialize=PACKING_INTS)
def _attn_fwd_kernel(p_q, p_qe, p_k, p_vt, p_krec, p_pv, p_cu_q, p_cu_k, p_cu_kt, p_work, width,
                     p_o, p_lse, p_mo, p_ro,
                     total_q, total_k, tk_t, heads_q, heads_kv, s2, window_left, window_right, p_vtd,
                     TAU: tl.constexpr, SIGMA: tl.constexpr, D: tl.constexpr,
                     BM: tl.constexpr, BN: tl.constexpr, CODES: tl.constexpr, P4: tl.constexpr,
                     ROW_SUM: tl.constexpr, SUM_BLOCK: tl.constexpr, DIAG_BM: tl.constexpr, DIAG_BN: tl.constexpr,
                     APPROX_EXP: tl.constexpr, ALL4: tl.constexpr, INTERPRET: tl.constexpr):
    """One ((document, query tile), query head) program; see the module docstring. P4, ROW_SUM,
    SUM_BLOCK, APPROX_EXP: ``fwd_math.scores_to_codes``'; DIAG_BM, DIAG_BN: the query rows and keys over
    which the 4-bit routes decide diagonal tiles (BM, or a multiple: the ``fwd_diag_block_m`` ablation;
    ``NumericsTiles.diag_block_n``); ALL4, p_vtd:
    ``_attend_tile``'s (p_vtd None otherwise)."""
    doc, tile = program_tile(p_work, width)  # longest documents, and their last tiles, first
    if doc < 0:
        return
    h, hk, q_start, len_q, len_k, k_start, k_start_t, i0, off, wl, wr, t_lo, u_lo, u_hi, t_hi = program_geometry(
        doc, tile, p_cu_q, p_cu_k, p_cu_kt, heads_q, heads_kv, window_left, window_right, BM, BN)
    o_m = i0 + tl.arange(0, BM)                                     # [BM] query positions
    b_first, b_last = visible_keys(o_m, off, wl, wr, len_k)
    o_d = tl.arange(0, D)
    m_row = o_m < len_q
    o_row = q_start.to(tl.int64) + o_m                              # packed query rows
    b_q = tl.load(p_q + (o_row[:, None] * heads_q + h) * D + o_d[None, :], mask=m_row[:, None], other=0.0)  # [BM, D]
    b_qf = query_factors(p_qe, o_row, m_row, heads_q, h, s2, CODES)  # [BM]
    b_pv = tl.load(p_pv + o_row * heads_kv + hk, mask=m_row, other=0)  # [BM] int32
    b_rf = pow2(SIGMA - b_pv)

    k_row = k_start.to(tl.int64)
    p_k_doc = p_k + (k_row * heads_kv + hk) * D
    o_vt_doc = hk.to(tl.int64) * D * tk_t + k_start_t.to(tl.int64)
    p_vt_doc = p_vt + o_vt_doc
    p_vtd_doc = p_vtd
    if ALL4:
        p_vtd_doc = p_vtd + o_vt_doc
    p_krec_doc = p_krec + hk.to(tl.int64) * total_k + k_row
    b_acc = tl.zeros([BM, D], tl.float32)
    b_l = tl.zeros([BM], tl.float32)
    b_m = tl.full([BM], float("-inf"), tl.float32)
    # Ascending key order in three runs: window-edge tiles (masked), inner tiles (unmasked),
    # diagonal and document-end tiles (masked).
    t_runs = (t_lo, u_lo, u_hi, t_hi)
    for run in tl.static_range(3):
        for t in range(t_runs[run], t_runs[run + 1]):
            diag = diagonal_tile(t * BN // DIAG_BN, i0 // DIAG_BM * DIAG_BM, len_q, len_k, off, wl, wr, DIAG_BM, DIAG_BN)
            b_acc, b_l, b_m = _attend_tile(b_q, b_qf, b_rf, b_acc, b_l, b_m, p_k_doc, p_vt_doc, p_vtd_doc,
                                           p_krec_doc, t * BN, b_first, b_last, total_k - k_start, tk_t - k_start_t,
                                           heads_kv, tk_t, diag, len_k,
                                           TAU, D, BN, run != 1, CODES, P4, ROW_SUM, SUM_BLOCK, APPROX_EXP, ALL4,
                                           INTERPRET)

    b_ro, b_lse, b_m = finish_rows(b_l, b_m, b_pv, SIGMA)
    b_o = to_output(b_acc * b_ro[:, None], p_o.dtype.element_ty, INTERPRET)
    tl.store(p_o + (o_row[:, None] * heads_q + h) * D + o_d[None, :], b_o, mask=m_row[:, None])
    o_stat = h.to(tl.int64) * total_q + o_row
    tl.store(p_lse + o_stat, b_lse, mask=m_row)
    tl.store(p_mo + o_stat, b_m, mask=m_row)
    tl.store(p_ro + o_stat, b_ro, mask=m_row)


def attention_forward(q_codes, q_exps, k_codes, k_exps, v_codes_t, v_exps, pv, cu_seqlens_q, cu_seqlens_k,
                      cu_seqlens_k_t, *, causal: bool, window_size: tuple[int, int], softmax_scale: float, tau: int,
                      sigma: int, scale_block: int, tiles: AttnTiles, key_rec: torch.Tensor | None = None,
                      work: torch.Tensor | None = None, p4: int = 0, row_sum: int = 0,
                      diag_block_m: int | None = None, approx_exp: bool = False,
                      v_codes_t_diag: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16):
    """The forward on quantized operands (NUMERICS.md 3), in the codes' format: float8_e4m3fn
    (MXFP8) or bfloat16 (the BF16 recipe: every exponent 0). The mixed NVFP4 route
    (NUMERICS.md 6) gives bfloat16 Q and K codes (NVFP4 values times 2^-2) beside E4M3 V
    codes, and p4 = 1: 4-bit P off the diagonal tiles, which diag_block_m query rows decide
    (None: ``tiles.fwd_block_m``; a multiple of it for the ``fwd_diag_block_m`` ablation); 2:
    on every tile, its group maxima over masked keys too (``p4_scale_before_mask``); row_sum:
    what l adds (``configs.row_sum_mode``); approx_exp: P from Schraudolph's
    exponential (``fwd_approx_exp``). The all-4-bit route (NUMERICS.md 6) gives bfloat16 codes
    throughout, every value with its scales folded in and every exponent 0, p4 = 3 (4-bit P on
    every tile) or 2, and v_codes_t_diag: V^T with one power-of-two scale per key, laid out as
    v_codes_t, which the diagonal tiles multiply instead.

    q_codes [Tq, Hq, D] codes, q_exps [Tq, Hq] int8; k_codes [Tk, Hkv, D]
    codes (q_codes' dtype), k_exps [Tk, Hkv] int8; v_codes_t [Hkv, D, Tk_t] codes (V^T, tokens
    contiguous in the layout of ``layout.py``, zero codes outside documents: Hopper's FP8
    wgmma needs K-major B, so P@V reads V^T), v_exps [Tk, Hkv] int8; pv [Tq, Hkv] int32
    (``kernels.prefix.prefix_v_exponent``); scale_block: the tokens that share an exponent
    (32, or 1 for per-token exponents; K's blocks start at document starts);
    cu_seqlens_q/k int32 [num_docs + 1];
    cu_seqlens_k_t int32 [num_docs + 1], V^T's document starts (``aligned_starts``, as the
    quantizer returns them); key_rec: ``key_records(k_exps, v_exps)`` [Hkv, Tk] int32 if the
    caller has it (it serves the backward's dQ too), else built here. D is 64 or 128 and Hq a
    multiple of Hkv. work: the ``tile_list`` of query tiles (``fwd_block_m``, reversed) if the
    caller has it (``plan.build_plan``), else built here. BF16 Q and K codes may come without
    exponents (q_exps, k_exps None: the bf16 route's own bf16 inputs), then with key_rec.

    Returns out [Tq, Hq, D] in ``out_dtype`` (bf16, fp16 or fp32: the inputs', rounded once
    from fp32) and lse (natural log), m (integer running max, log2 units),
    ro = 2^(PV - sigma) / l, each [Hq, Tq] fp32.
    """
    tq, hq, d = q_codes.shape
    tk, hkv = k_codes.shape[:2]
    if d not in HEAD_DIMS:
        raise ValueError(f"q_codes: head dim must be one of {HEAD_DIMS}, got {d}")
    if hkv == 0 or hq % hkv:
        raise ValueError(f"k_codes: Hq={hq} must be a multiple of Hkv, got shape {tuple(k_codes.shape)}")
    num_docs = cu_seqlens_q.shape[0] - 1
    tk_t = transposed_extent(tk, num_docs)
    fmt, scores = format_of(v_codes_t), format_of(q_codes)
    all4 = v_codes_t_diag is not None
    if p4 and fmt != E4M3 and not all4:
        raise ValueError(f"p4: 4-bit P multiplies E4M3 V codes, or the all-4-bit route's with v_codes_t_diag, got "
                         f"v_codes_t of {v_codes_t.dtype}")
    if all4 and p4 not in (2, 3):
        raise ValueError(f"v_codes_t_diag: the all-4-bit route takes 4-bit P on every tile (p4 2 or 3), got {p4}")
    codes, i8, i32 = fmt.torch_dtype, torch.int8, torch.int32
    exps = [("q_exps", q_exps, i8, (tq, hq)), ("k_exps", k_exps, i8, (tk, hkv))]
    for name, x, _, _ in exps:
        if x is None and (scores != BF16 or (name == "k_exps" and key_rec is None)):
            raise ValueError(f"{name}: None only for BF16 Q and K codes (got {scores.name}), K's with key_rec")
    for name, x, dtype, shape in (
            ("q_codes", q_codes, scores.torch_dtype, (tq, hq, d)),
            ("k_codes", k_codes, scores.torch_dtype, (tk, hkv, d)),
            *(e for e in exps if e[1] is not None),
            ("v_codes_t", v_codes_t, codes, (hkv, d, tk_t)), ("v_exps", v_exps, i8, (tk, hkv)),
            *([("v_codes_t_diag", v_codes_t_diag, codes, (hkv, d, tk_t))] if all4 else []),
            ("pv", pv, i32, (tq, hkv)),
            ("cu_seqlens_q", cu_seqlens_q, i32, (num_docs + 1,)), ("cu_seqlens_k", cu_seqlens_k, i32, (num_docs + 1,)),
            ("cu_seqlens_k_t", cu_seqlens_k_t, i32, (num_docs + 1,))):
        check_operand(name, x, dtype, shape)
    wl, wr = effective_window(causal, window_size)
    diag_block_m = diag_block_m or tiles.fwd_block_m
    if diag_block_m % tiles.fwd_block_m:
        raise ValueError(f"diag_block_m: a multiple of the query tile {tiles.fwd_block_m}, got {diag_block_m}")
    if scale_block not in (1, 32):  # the Gluon kernel's key tiles are multiples of 32 (AttnTiles)
        raise ValueError(f"scale_block: must be 1 or 32, got {scale_block}")

    dev = q_codes.device
    if out_dtype not in INPUT_DTYPES:
        raise ValueError(f"out_dtype: must be one of {INPUT_DTYPES}, got {out_dtype}")
    out = torch.empty((tq, hq, d), dtype=out_dtype, device=dev)
    lse, m, ro = (torch.empty((hq, tq), dtype=torch.float32, device=dev) for _ in range(3))
    if tq == 0 or num_docs == 0 or hq == 0:
        return out, lse, m, ro
    if key_rec is None:
        key_rec = key_records(k_exps, v_exps)
    check_operand("key_rec", key_rec, i32, (hkv, tk))
    if work is None:
        work = tile_list(cu_seqlens_q, tq, tiles.fwd_block_m, reverse=True)
    check_operand("work", work, i32, (2, list_extent(tq, num_docs, tiles.fwd_block_m)))
    grid = (work.shape[1], hq)
    rest = (key_rec, pv, cu_seqlens_q, cu_seqlens_k, cu_seqlens_k_t, work, work.shape[1], out, lse, m, ro,
            tq, tk, tk_t, hq, hkv, softmax_scale * LOG2E, wl, wr)
    # l from the codes sums each V scale block's E4M3 codes first (exact; ``block_sums``), where
    # key tiles hold whole blocks (the Gluon kernel's always do)
    sum_block = scale_block if row_sum == 2 and fmt == E4M3 and tiles.fwd_block_n % scale_block == 0 else 1
    common = dict(TAU=tau, SIGMA=sigma, D=d, BM=tiles.fwd_block_m, BN=tiles.fwd_block_n, CODES=fmt.codes, P4=p4,
                  ROW_SUM=row_sum, SUM_BLOCK=sum_block, DIAG_BM=diag_block_m, DIAG_BN=tiles.diag_block_n,
                  APPROX_EXP=approx_exp,
                  num_warps=tiles.fwd_warps)
    if tiles.fwd_gluon and not interpreting():
        q_desc, k_desc, vt_desc, vtd_desc = operand_descriptors(q_codes, k_codes, v_codes_t, tiles.fwd_block_m,
                                                                tiles.fwd_block_n, v_codes_t_diag)
        launch(attn_fwd_gluon_kernel, grid, q_desc, q_exps, k_desc, vt_desc, *rest, vtd_desc=vtd_desc,
               STAGES=tiles.fwd_stages, SCALE_BLOCK=scale_block, SCORE_CODES=scores.codes, ALL4=all4, **common)
    else:
        launch(_attn_fwd_kernel, grid, q_codes, q_exps, k_codes, v_codes_t, *rest, p_vtd=v_codes_t_diag,
               ALL4=all4, INTERPRET=interpreting(), num_stages=tiles.fwd_stages, **common)
    return out, lse, m, ro
