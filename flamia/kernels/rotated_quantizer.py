"""The Q/K launch of the fused quantizer on the GPU, in Gluon: one thread per token row.

The Hadamard rotation pairs head-dim elements at distances 1 to D/2. In the Triton kernel
(``quantize._quantize_operand_kernel``) the compiler spreads a row over threads, so most
butterfly stages exchange values between threads (SHFL and FSEL on top of the adds), and
the rotation, not memory, bounds the launch. Gluon (``triton.experimental.gluon``) lets the
kernel name its layouts: here each thread holds a whole row of D fp32 values, so every
stage of the shared ``hadamard.rotate`` is in-register arithmetic (7 FADD per element, the
minimum, no exchange). A row per thread would make each 16-byte load and store of a warp
touch 32 rows, so the rows arrive and leave in coalesced layouts (16 bytes per thread along
a row) and change layout through shared memory. The transposed codes leave first and in
pieces of head-dim rows (``_store_columns``), so the whole tile's moved values are never
live at once and more warps fit on an SM. The mixed NVFP4 route's score codes and the
all-4-bit route's values (with the rotation on) come from the same rows: a row's 16-element
groups lie in its thread, and so do a transposed piece's 16-token groups, so their maxima and
scales need no exchange either.

The arithmetic is the Triton kernel's, through the same helpers (``rotate``,
``block_exponents``, ``to_e4m3``, ``fp4.group_score_codes``, ``fp4.token_group_values``,
``fp4.e2m1_pow2``; layout.py's ``unit_columns``, ``zero_padding``), so the codes
are equal bit for bit; the GPU tests check them against the torch reference. Gluon has no
CPU interpreter, so under TRITON_INTERPRET ``quantize_operand`` runs the Triton kernel,
which the CPU suite checks the same way.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .fp4 import G_SHIFT, GROUP, e2m1_pow2, group_score_codes, token_group_values
from .fp8 import E4M3_EQ, E4M3_MQ, abs_max, block_exponents, inf_to_nan, pow2, scale_exponent, to_e4m3
from .hadamard import rotate
from .launch import PACKING_INTS
from .layout import column_offsets, mma_token_order, unit_columns, zero_padding
from .worklist import program_tile_within


@gluon.jit
def packed_rows(t0, end, h, H, UNIT: gl.constexpr, D: gl.constexpr, L: gl.constexpr):
    """Offsets [UNIT, D] (int64) of head h's elements of packed rows t0.. in [T, H, D], in
    layout L, and the mask of the rows before ``end``."""
    o_t = t0 + gl.arange(0, UNIT, layout=gl.SliceLayout(1, L))  # [UNIT]
    o_x = (o_t[:, None] * H + h) * D + gl.arange(0, D, layout=gl.SliceLayout(0, L))[None, :]
    return o_x, (o_t < end)[:, None]


@gluon.jit
def zero_transposed_padding(p_t, p_diag, cu_seqlens_t, doc, length, num_docs, h, T_t, D: gl.constexpr,
                            T_ALIGN: gl.constexpr, COLS: gl.constexpr):
    """``layout.zero_padding`` of head h's share of a transposed operand [H, D, T_t] and, where
    p_diag is given, of its per-token twin, from a program in layout COLS [D, tokens]."""
    o_d = gl.arange(0, D, layout=gl.SliceLayout(1, COLS)).to(gl.int64)  # [D] head-dim rows
    o_j = gl.arange(0, 2 * T_ALIGN, layout=gl.SliceLayout(0, COLS))
    zero_padding(p_t, cu_seqlens_t, doc, length, num_docs, h, o_d, o_j, T_t, D, T_ALIGN)
    if p_diag is not None:
        zero_padding(p_diag, cu_seqlens_t, doc, length, num_docs, h, o_d, o_j, T_t, D, T_ALIGN)


@gluon.jit
def group_score_codes_in(b_x, b_e, GROUPS: gl.constexpr, b_flag=None):
    """``fp4.score_codes`` of b_x [U, D] fp32 on the exponents b_e [U] int32, formed in GROUPS,
    a layout of [U, D / 16, 16] whose threads each hold whole 16-element groups, so their
    maxima need no exchange: [U, D] fp32. b_flag [U] fp32 (0, or NaN for a row with a
    non-finite element that b_x, part of the row, may not hold) makes those rows NaN."""
    U: gl.constexpr = b_x.shape[0]
    D: gl.constexpr = b_x.shape[1]
    b_groups = gl.convert_layout(gl.reshape(b_x, [U, D // GROUP, GROUP]), GROUPS)  # [U, D / 16, 16]
    if b_flag is not None:
        # x + 0 is x, save -0 -> +0, whose score code is +0 either way (no nonzero ratio)
        b_groups = b_groups + gl.convert_layout(b_flag, gl.SliceLayout(1, gl.SliceLayout(2, GROUPS)))[:, None, None]
    b_g = pow2(gl.convert_layout(b_e, gl.SliceLayout(1, gl.SliceLayout(2, GROUPS))) - G_SHIFT)  # [U]
    return gl.reshape(group_score_codes(b_groups, b_g[:, None, None]), [U, D])


@gluon.jit
def _score_codes(b_x, b_e, b_flag=None):
    """``group_score_codes_in`` of b_x [UNIT, C] fp32 (a token row, or a piece of one, per
    thread): a row's groups in its thread."""
    C: gl.constexpr = b_x.shape[1]
    GROUPS: gl.constexpr = gl.BlockedLayout([1, C // GROUP, GROUP], [32, 1, 1], [gl.num_warps(), 1, 1], [2, 1, 0])
    return group_score_codes_in(b_x, b_e, GROUPS, b_flag)


@gluon.jit
def _store_columns(p_t, p_diag, b_x, b_tok, d0, o_c, m_c, h, T_t, D: gl.constexpr, PIECE: gl.constexpr,
                   COLS: gl.constexpr, FINITE: gl.constexpr, FP4: gl.constexpr):
    """Store b_x [UNIT, C] fp32 (a token row per thread) as head-dim rows d0..d0+C of head h of
    a transposed operand [H, D, T_t], at columns o_c where m_c (b_tok, o_c, m_c: [UNIT] each,
    in layout SliceLayout(0, COLS)), PIECE rows at a time: each piece goes through shared
    memory alone, so the moved values of the whole tile are never live at once (fewer
    registers per thread, so more warps per SM). What a piece becomes: the E4M3 codes of b_x
    times b_tok (None: b_x is scaled), FINITE: b_x has no +-inf (``inf_to_nan`` done), else
    each piece is made so; with FP4 the all-4-bit route's bf16 values in 16-token groups
    (``fp4.token_group_values``: a thread's 16 consecutive tokens), and where p_diag is given
    its per-token values there, under each token's max |x| b_tok (``fp4.e2m1_pow2``)."""
    UNIT: gl.constexpr = b_x.shape[0]
    C: gl.constexpr = b_x.shape[1]
    if C > PIECE:
        b_lo, b_hi = gl.split(gl.permute(gl.reshape(b_x, [UNIT, 2, C // 2]), [0, 2, 1]))  # [UNIT, C / 2] each
        _store_columns(p_t, p_diag, b_lo, b_tok, d0, o_c, m_c, h, T_t, D, PIECE, COLS, FINITE, FP4)
        _store_columns(p_t, p_diag, b_hi, b_tok, d0 + C // 2, o_c, m_c, h, T_t, D, PIECE, COLS, FINITE, FP4)
    else:
        o_d = d0 + gl.arange(0, C, layout=gl.SliceLayout(1, COLS)).to(gl.int64)  # [C] head-dim rows
        o_t = column_offsets(o_d, o_c, h, T_t, D)
        b_t = gl.permute(b_x, [1, 0])  # [C, UNIT]
        if not FP4:
            if b_tok is None and not FINITE:
                b_t = inf_to_nan(b_t)
            # fp32 values move and round after: moved as fp8 or int8, the transposed codes
            # come back wrong (Triton 3.6's layout conversion through shared memory).
            b_t = gl.convert_layout(mma_token_order(b_t, gl.float8e4nv), COLS)
            if b_tok is not None:
                # the columns hold their tokens in mma_token_order, so the factors move with them
                b_f = gl.reshape(mma_token_order(gl.expand_dims(b_tok, 0), gl.float8e4nv), [UNIT])  # [UNIT]
                b_t = b_t * gl.convert_layout(b_f, gl.SliceLayout(0, COLS))[None, :]
                if not FINITE:
                    b_t = inf_to_nan(b_t)
            gl.store(p_t + o_t, to_e4m3(b_t, False), mask=m_c[None, :])
        else:
            b_t = gl.convert_layout(b_t, COLS)  # BF16's token order is the tokens' own
            gl.store(p_t + o_t, gl.convert_layout(token_group_values(b_t), COLS).to(gl.bfloat16), mask=m_c[None, :])
            if p_diag is not None:
                gl.store(p_diag + o_t, e2m1_pow2(b_t, b_tok[None, :]).to(gl.bfloat16), mask=m_c[None, :])


@gluon.jit
def _rotated_unit(p_x, p_codes, p_codes_t, p_exps, cu_seqlens, cu_seqlens_t, p_work, width, T_t, H, h, num_docs,
                  inv_sqrt_d, p_diag_t, D: gl.constexpr, UNIT: gl.constexpr, BLOCK: gl.constexpr,
                  HADAMARD_STAGES: gl.constexpr, T_ALIGN: gl.constexpr, PARTS: gl.constexpr, SCORES: gl.constexpr,
                  FP4: gl.constexpr):
    """This program's unit of head h (int64) of one operand."""
    # [UNIT, D]: a token row per thread, for the butterflies. LOAD and STORE: 16 bytes per
    # thread, consecutive threads along a row, so each warp reads and writes whole rows at once
    # (a row per thread leaves each 16-byte access in a different row: cache-bound); the
    # layout changes go through shared memory. [D, UNIT]: 16 consecutive tokens of
    # one head-dim element per thread, so each thread stores 16 bytes of the transposed codes.
    ROWS: gl.constexpr = gl.BlockedLayout([1, D], [32, 1], [gl.num_warps(), 1], [1, 0])
    LOAD: gl.constexpr = gl.BlockedLayout([1, 8], [256 // D, D // 8], [gl.num_warps(), 1], [1, 0])
    STORE: gl.constexpr = gl.BlockedLayout([1, 16], [512 // D, D // 16], [gl.num_warps(), 1], [1, 0])
    COLS: gl.constexpr = gl.BlockedLayout([1, 16], [32 * 16 // UNIT, UNIT // 16], [gl.num_warps(), 1], [1, 0])
    doc, unit = program_tile_within(p_work, width)
    if doc < 0:
        return
    start = gl.load(cu_seqlens + doc).to(gl.int64)
    end = gl.load(cu_seqlens + doc + 1).to(gl.int64)
    if unit == 0:
        zero_transposed_padding(p_codes_t, p_diag_t, cu_seqlens_t, doc, (end - start).to(gl.int32), num_docs, h, T_t,
                                D, T_ALIGN, COLS)
    if start + unit * UNIT >= end:
        return
    # Rows past the document's end load as zeros: they add nothing to a block maximum.
    o_x, m_x = packed_rows(start + unit * UNIT, end, h, H, UNIT, D, LOAD)
    b_x = gl.convert_layout(gl.load(p_x + o_x, mask=m_x, other=0.0), ROWS)  # [UNIT, D]
    b_x = rotate(b_x.to(gl.float32), inv_sqrt_d, HADAMARD_STAGES)
    # [UNIT] this unit's columns of codes_t, valid up to its document's next multiple of T_ALIGN
    o_c, m_c = unit_columns(cu_seqlens_t, doc, (end - start).to(gl.int32),
                            unit * UNIT + gl.arange(0, UNIT, layout=gl.SliceLayout(0, COLS)), T_ALIGN)
    if FP4:
        # The all-4-bit route (quantize._quantize_unit's FP4): every scale folded into bf16
        # values, exponents 0; NVFP4 rows on each token's own g.
        b_amax = abs_max(b_x, 1)  # [UNIT]
        _store_columns(p_codes_t, p_diag_t, b_x, gl.convert_layout(b_amax, gl.SliceLayout(0, COLS)), 0, o_c, m_c, h,
                       T_t, D, D // PARTS, COLS, True, True)
        b_g = scale_exponent(b_amax, E4M3_EQ, E4M3_MQ)  # [UNIT] each token's NVFP4 exponent
        b_v = gl.convert_layout(_score_codes(b_x, b_g), ROWS) * pow2(b_g)[:, None]  # [UNIT, D]
        o_x, m_x = packed_rows(start + unit * UNIT, end, h, H, UNIT, D, STORE)
        gl.store(p_codes + o_x, gl.convert_layout(b_v.to(gl.bfloat16), STORE), mask=m_x)
        b_e = gl.zeros([UNIT], gl.int32, layout=gl.SliceLayout(1, ROWS))
    else:
        b_e = gl.convert_layout(block_exponents(b_x, BLOCK), gl.SliceLayout(1, ROWS))  # [UNIT]
        _rotated_codes(p_codes, p_codes_t, b_x, b_e, o_c, m_c, start, end, unit, h, T_t, H, D, UNIT, PARTS, SCORES,
                       HADAMARD_STAGES > 0, ROWS, STORE, COLS)
    o_t = start + unit * UNIT + gl.arange(0, UNIT, layout=gl.SliceLayout(1, ROWS))  # [UNIT] packed rows
    gl.store(p_exps + o_t * H + h, b_e.to(gl.int8), mask=o_t < end)


@gluon.jit
def _rotated_codes(p_codes, p_codes_t, b_x, b_e, o_c, m_c, start, end, unit, h, T_t, H, D: gl.constexpr,
                   UNIT: gl.constexpr, PARTS: gl.constexpr, SCORES: gl.constexpr, ROTATED: gl.constexpr,
                   ROWS: gl.constexpr, STORE: gl.constexpr, COLS: gl.constexpr):
    """The E4M3 transposed codes of rows b_x [UNIT, D] fp32 on exponents b_e [UNIT] int32, and
    their row codes (SCORES: ``rotated_operand_kernel``'s; ROTATED: b_x is rotated)."""
    if SCORES == 1:
        # NVFP4 score codes (their 16-element groups lie in one thread) come from x itself, so
        # each piece of x leaves as both codes and dies: x and a scaled copy are never live together.
        # A non-finite x makes its whole row's scales NaN, where a piece's own groups see one
        # piece: unrotated, the row's flag goes into every piece (the rotation spreads it anyway).
        b_flag = None
        if not ROTATED:
            b_flag = gl.sum(b_x * 0.0, axis=1)  # [UNIT] 0, or NaN where the row has a non-finite x
        # Score codes in pieces as wide as the transposed ones (D / PARTS head-dim rows), but 64
        # at d=128, where pieces of 32 spill on Triton 3.9 (docs/PERFORMANCE.md).
        SCORE_PIECE: gl.constexpr = 64 if D == 128 else D // PARTS
        _store_score_pieces(p_codes, p_codes_t, b_x, b_e, gl.convert_layout(pow2(-b_e), gl.SliceLayout(0, COLS)),
                            b_flag, 0, o_c, m_c, start + unit * UNIT, end, h, T_t, H, D, SCORE_PIECE, D // PARTS, COLS)
    else:
        b_scaled = b_x * pow2(-b_e)[:, None]  # [UNIT, D]
        if SCORES == 0:  # E4M3 codes everywhere; BF16 row codes keep an Inf, as torch's cast does
            b_scaled = inf_to_nan(b_scaled)
        # The transposed codes before the row codes, while b_scaled is live anyway: then the
        # row codes' layout change does not hold b_scaled and the moved values together.
        _store_columns(p_codes_t, None, b_scaled, None, 0, o_c, m_c, h, T_t, D, D // PARTS, COLS, SCORES == 0, False)
        o_x, m_x = packed_rows(start + unit * UNIT, end, h, H, UNIT, D, STORE)
        if SCORES == 2:  # bf16_scores: the row codes are S's BF16 codes
            gl.store(p_codes + o_x, gl.convert_layout(b_scaled.to(gl.bfloat16), STORE), mask=m_x)
        else:
            # The codes change layout as int8: as fp8, a layout change returned wrong codes.
            b_c = gl.convert_layout(to_e4m3(b_scaled, False).to(gl.int8, bitcast=True), STORE)
            gl.store(p_codes + o_x, b_c.to(gl.float8e4nv, bitcast=True), mask=m_x)


@gluon.jit
def _store_score_pieces(p_codes, p_codes_t, b_x, b_e, b_f, b_flag, d0, o_c, m_c, t0, end, h, T_t, H,
                        D: gl.constexpr, SCORE_PIECE: gl.constexpr, PIECE: gl.constexpr, COLS: gl.constexpr):
    """The mixed NVFP4 route's codes of head-dim columns d0.. of rows b_x [UNIT, C] fp32 (a
    token row per thread, exponents b_e [UNIT], their factors 2^-e b_f in SliceLayout(0, COLS)),
    SCORE_PIECE columns at a time: each piece's E4M3 transposed codes (``_store_columns``, in
    pieces of PIECE head-dim rows) and its score codes (``_score_codes``: its 16-element groups
    lie in the piece, plus the row's non-finite flag b_flag [UNIT] where given), so each piece
    of x dies as it leaves."""
    UNIT: gl.constexpr = b_x.shape[0]
    C: gl.constexpr = b_x.shape[1]
    if C > SCORE_PIECE:
        b_lo, b_hi = gl.split(gl.permute(gl.reshape(b_x, [UNIT, 2, C // 2]), [0, 2, 1]))  # [UNIT, C / 2] each
        _store_score_pieces(p_codes, p_codes_t, b_lo, b_e, b_f, b_flag, d0, o_c, m_c, t0, end, h, T_t, H, D,
                            SCORE_PIECE, PIECE, COLS)
        _store_score_pieces(p_codes, p_codes_t, b_hi, b_e, b_f, b_flag, d0 + C // 2, o_c, m_c, t0, end, h, T_t, H, D,
                            SCORE_PIECE, PIECE, COLS)
    else:
        _store_columns(p_codes_t, None, b_x, b_f, d0, o_c, m_c, h, T_t, D, PIECE, COLS, False, False)
        STORE: gl.constexpr = gl.BlockedLayout([1, 8], [256 // C, C // 8], [gl.num_warps(), 1], [1, 0])
        o_t = t0 + gl.arange(0, UNIT, layout=gl.SliceLayout(1, STORE))  # [UNIT] packed rows
        o_x = (o_t[:, None] * H + h) * D + d0 + gl.arange(0, C, layout=gl.SliceLayout(0, STORE))[None, :]
        gl.store(p_codes + o_x, gl.convert_layout(_score_codes(b_x, b_e, b_flag).to(gl.bfloat16), STORE),
                 mask=(o_t < end)[:, None])


@gluon.jit(do_not_specialize=PACKING_INTS)
def rotated_operand_kernel(p_x, p_codes, p_codes_t, p_exps, cu_seqlens, cu_seqlens_t, p_work, width, T_t, H,
                           p_x2, p_codes2, p_codes_t2, p_exps2, cu_seqlens2, cu_seqlens_t2, p_work2, width2, T_t2, H2,
                           num_docs, inv_sqrt_d, p_diag_t, p_diag_t2, D: gl.constexpr, UNIT: gl.constexpr,
                           BLOCK: gl.constexpr, HADAMARD_STAGES: gl.constexpr, T_ALIGN: gl.constexpr,
                           PARTS: gl.constexpr, PAIR: gl.constexpr, SCORES: gl.constexpr, FP4: gl.constexpr):
    """Program ((document, unit), head), UNIT = 32 * num_warps tokens: the arguments and the
    outputs of ``quantize._quantize_operand_kernel`` with the rotation on and the transposed
    codes written (PAIR: heads H.. quantize the second operand); PARTS: the transposed codes
    leave in PARTS pieces of D / PARTS head-dim rows (``_store_columns``); SCORES: what the
    row codes hold, as ``quantize._quantize_unit``'s (0 E4M3 codes, 1 the mixed NVFP4 route's
    score codes, 2 BF16 codes), each on the same exponents, with E4M3 transposed codes; FP4:
    the all-4-bit route's bf16 values instead (with its rotation on; without it, the launch
    of ``fp4_quantizer_gluon.py``), with each operand's per-token transposed values where
    p_diag_t (p_diag_t2) is given."""
    h = gl.program_id(1).to(gl.int64)
    if PAIR and h >= H:
        _rotated_unit(p_x2, p_codes2, p_codes_t2, p_exps2, cu_seqlens2, cu_seqlens_t2, p_work2, width2, T_t2, H2,
                      h - H, num_docs, inv_sqrt_d, p_diag_t2, D, UNIT, BLOCK, HADAMARD_STAGES, T_ALIGN, PARTS,
                      SCORES, FP4)
    else:
        _rotated_unit(p_x, p_codes, p_codes_t, p_exps, cu_seqlens, cu_seqlens_t, p_work, width, T_t, H, h, num_docs,
                      inv_sqrt_d, p_diag_t, D, UNIT, BLOCK, HADAMARD_STAGES, T_ALIGN, PARTS, SCORES, FP4)
