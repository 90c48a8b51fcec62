"""The all-4-bit route's quantizer launches on the GPU, in Gluon: a thread per 16-element group.

The Triton launches (``quantize._quantize_operand_kernel`` and
``quantize._quantize_grad_output_kernel`` with FP4) leave the layouts to the compiler, which
spreads the 16-element NVFP4 groups of a row and the 16-token groups of the transposed values
over threads, so every group maximum takes shuffles; a token row per thread
(``rotated_quantizer.py``) keeps them in registers but holds 255 registers in one warp. Here
the rows arrive with 16 consecutive head-dim elements per thread (one NVFP4 group, 32 bytes of
one row), and the transposed values leave with 16 consecutive tokens of one head-dim row per
thread (one token group, 32 bytes of one column run), the change between them going through
shared memory once. Only a row's maximum (and dO's sum D) cross threads.

Two launches: Q and K (one launch, as a pair) or V without the rotation
(``fp4_operand_kernel``), and dO with dO ro and D (``fp4_grad_output_kernel``). The arithmetic
is the Triton launches', through the same helpers (``rotated_quantizer.group_score_codes_in``,
``fp4.token_group_values``, ``fp4.e2m1_pow2``, ``records.store_query_records``), so the values
are equal bit for bit; D sums the same products in another order. Gluon has no CPU
interpreter, so under TRITON_INTERPRET the Triton launches run.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .fp4 import e2m1_pow2, token_group_values
from .fp4 import GROUP as NVFP4_GROUP
from .fp8 import E4M3_EQ, E4M3_MQ, abs_max, pow2, scale_exponent
from .launch import PACKING_INTS
from .layout import column_offsets, unit_columns
from .records import UNIT_FACTORS, store_query_records
from .rotated_quantizer import group_score_codes_in, packed_rows, zero_transposed_padding
from .worklist import program_tile, program_tile_within


@gluon.constexpr_function
def row_groups(U, D, warps):
    """[U, D] with 16 consecutive head-dim elements (one NVFP4 group) per thread, the rows'
    threads side by side, over U * D / 512 warps."""
    return gl.BlockedLayout([1, NVFP4_GROUP], [512 // D, D // NVFP4_GROUP], [warps, 1], [1, 0])


@gluon.constexpr_function
def token_groups(U, D, warps):
    """[D, U] with 16 consecutive tokens of one head-dim row per thread, over U * D / 512 warps."""
    return gl.BlockedLayout([1, 16], [512 // U, U // 16], [warps, 1], [1, 0])


@gluon.jit
def _nvfp4_values(b_x, b_amax, ROWS: gl.constexpr):
    """``fp4.nvfp4_values`` of rows b_x [U, D] fp32 in layout ROWS (``row_groups``), each
    row's max |x| b_amax [U]: [U, D] fp32 in ROWS."""
    U: gl.constexpr = b_x.shape[0]
    D: gl.constexpr = b_x.shape[1]
    GROUPS: gl.constexpr = gl.BlockedLayout([1, 1, NVFP4_GROUP], [512 // D, D // NVFP4_GROUP, 1],
                                            [gl.num_warps(), 1, 1], [2, 1, 0])
    b_e = scale_exponent(b_amax, E4M3_EQ, E4M3_MQ)  # [U] each token's NVFP4 exponent
    return gl.convert_layout(group_score_codes_in(b_x, b_e, GROUPS), ROWS) * pow2(b_e)[:, None]


@gluon.jit
def _store_token_groups(p_t, p_diag, b_x, b_amax, cu_seqlens_t, doc, length, unit, h, T_t, D: gl.constexpr,
                        T_ALIGN: gl.constexpr, COLS: gl.constexpr):
    """Rows b_x [U, D] fp32 (unit ``unit`` of U tokens of document doc, ``length`` tokens long)
    as head h's transposed values of [H, D, T_t] (tokens in their own order, BF16's): 16-token
    groups (``fp4.token_group_values``), and where p_diag is given per-token values under each
    token's max |x| b_amax [U] (``fp4.e2m1_pow2``)."""
    U: gl.constexpr = b_x.shape[0]
    o_d = gl.arange(0, D, layout=gl.SliceLayout(1, COLS)).to(gl.int64)  # [D] head-dim rows
    o_c, m_c = unit_columns(cu_seqlens_t, doc, length, unit * U + gl.arange(0, U, layout=gl.SliceLayout(0, COLS)),
                            T_ALIGN)
    o_t = column_offsets(o_d, o_c, h, T_t, D)  # [D, U]
    b_t = gl.convert_layout(gl.permute(b_x, [1, 0]), COLS)  # [D, U]
    gl.store(p_t + o_t, gl.convert_layout(token_group_values(b_t), COLS).to(gl.bfloat16), mask=m_c[None, :])
    if p_diag is not None:
        b_tok = gl.convert_layout(b_amax, gl.SliceLayout(0, COLS))  # [U]
        gl.store(p_diag + o_t, e2m1_pow2(b_t, b_tok[None, :]).to(gl.bfloat16), mask=m_c[None, :])


@gluon.jit
def _unit_start(p_t, p_diag_t, cu_seqlens, cu_seqlens_t, doc, unit, num_docs, h, T_t, D: gl.constexpr,
                UNIT: gl.constexpr, T_ALIGN: gl.constexpr, COLS: gl.constexpr):
    """(t0, end, length) of unit ``unit`` (UNIT tokens) of document doc: its first packed row
    and the document's end (int64; nothing to do where t0 >= end) and length (int32). The
    unit 0 program zeroes the document's transposed padding of head h in p_t (and p_diag_t)."""
    start = gl.load(cu_seqlens + doc).to(gl.int64)
    end = gl.load(cu_seqlens + doc + 1).to(gl.int64)
    length = (end - start).to(gl.int32)
    if unit == 0:
        zero_transposed_padding(p_t, p_diag_t, cu_seqlens_t, doc, length, num_docs, h, T_t, D, T_ALIGN, COLS)
    return start + unit * UNIT, end, length


@gluon.jit
def _operand_unit(p_x, p_codes, p_codes_t, p_exps, cu_seqlens, cu_seqlens_t, p_work, width, T_t, H, h, num_docs,
                  p_diag_t, p_key_rec, T, D: gl.constexpr, UNIT: gl.constexpr, T_ALIGN: gl.constexpr):
    """This program's unit of head h (int64) of one operand."""
    ROWS: gl.constexpr = row_groups(UNIT, D, gl.num_warps())
    COLS: gl.constexpr = token_groups(UNIT, D, gl.num_warps())
    doc, unit = program_tile_within(p_work, width)
    if doc < 0:
        return
    t0, end, length = _unit_start(p_codes_t, p_diag_t, cu_seqlens, cu_seqlens_t, doc, unit, num_docs, h, T_t, D,
                                  UNIT, T_ALIGN, COLS)
    if t0 >= end:
        return
    # Rows past the document's end load as zeros: their values and their columns' are 0.
    o_x, m_x = packed_rows(t0, end, h, H, UNIT, D, ROWS)  # [UNIT, D]
    b_x = gl.load(p_x + o_x, mask=m_x, other=0.0).to(gl.float32)  # [UNIT, D]
    b_amax = abs_max(b_x, 1)  # [UNIT]
    _store_token_groups(p_codes_t, p_diag_t, b_x, b_amax, cu_seqlens_t, doc, length, unit, h, T_t, D, T_ALIGN, COLS)
    gl.store(p_codes + o_x, _nvfp4_values(b_x, b_amax, ROWS).to(gl.bfloat16), mask=m_x)
    o_t = t0 + gl.arange(0, UNIT, layout=gl.SliceLayout(1, ROWS))  # [UNIT] packed rows
    gl.store(p_exps + o_t * H + h, gl.full([UNIT], 0, gl.int8, layout=gl.SliceLayout(1, ROWS)), mask=o_t < end)
    if p_key_rec is not None:  # V's: K's and V's exponents are 0
        gl.store(p_key_rec + h * T + o_t, gl.full([UNIT], UNIT_FACTORS, gl.int32, layout=gl.SliceLayout(1, ROWS)),
                 mask=o_t < end)


@gluon.jit(do_not_specialize=PACKING_INTS)
def fp4_operand_kernel(p_x, p_codes, p_codes_t, p_exps, cu_seqlens, cu_seqlens_t, p_work, width, T_t, H,
                       p_x2, p_codes2, p_codes_t2, p_exps2, cu_seqlens2, cu_seqlens_t2, p_work2, width2, T_t2, H2,
                       num_docs, p_diag_t, p_diag_t2, p_key_rec, T, D: gl.constexpr, UNIT: gl.constexpr,
                       T_ALIGN: gl.constexpr, PAIR: gl.constexpr):
    """Program ((document, unit of UNIT tokens), head), a warp per 512 elements: the arguments and
    outputs of ``quantize._quantize_operand_kernel`` on the all-4-bit route without the
    rotation (PAIR: heads H.. quantize the second operand; p_diag_t, p_diag_t2: each
    operand's per-token transposed values where given; p_key_rec [H, T] int32: the first
    operand's key records where given). D <= 128, UNIT in [32, 512], powers of two."""
    h = gl.program_id(1).to(gl.int64)
    if PAIR and h >= H:
        _operand_unit(p_x2, p_codes2, p_codes_t2, p_exps2, cu_seqlens2, cu_seqlens_t2, p_work2, width2, T_t2, H2,
                      h - H, num_docs, p_diag_t2, None, T, D, UNIT, T_ALIGN)
    else:
        _operand_unit(p_x, p_codes, p_codes_t, p_exps, cu_seqlens, cu_seqlens_t, p_work, width, T_t, H, h, num_docs,
                      p_diag_t, p_key_rec, T, D, UNIT, T_ALIGN)


@gluon.jit(do_not_specialize=PACKING_INTS)
def fp4_grad_output_kernel(p_do, p_o, p_ro, p_do_codes, p_do_exps, p_dot_t, p_dot_exps, p_delta,
                           cu_seqlens, cu_seqlens_t, p_work, width, num_docs, T, T_t, H,
                           p_qe, p_pv, p_m, p_rec, heads_kv, D: gl.constexpr, STEP: gl.constexpr,
                           RECORDS: gl.constexpr, GROUP: gl.constexpr, SIGMA: gl.constexpr,
                           T_ALIGN: gl.constexpr):
    """Program ((document, unit of STEP tokens), head): the arguments and outputs of
    ``quantize._quantize_grad_output_kernel`` with FP4 on (GROUP: query heads per KV head).
    D <= 512 and 16 <= STEP <= 512, powers of two."""
    ROWS: gl.constexpr = row_groups(STEP, D, gl.num_warps())
    COLS: gl.constexpr = token_groups(STEP, D, gl.num_warps())
    doc, unit = program_tile(p_work, width)
    if doc < 0:
        return
    h = gl.program_id(1).to(gl.int64)
    t0, end, length = _unit_start(p_dot_t, None, cu_seqlens, cu_seqlens_t, doc, unit, num_docs, h, T_t, D, STEP,
                                  T_ALIGN, COLS)
    if t0 >= end:
        return
    o_x, m_x = packed_rows(t0, end, h, H, STEP, D, ROWS)  # [STEP, D]
    b_do = gl.load(p_do + o_x, mask=m_x, other=0.0).to(gl.float32)  # [STEP, D]
    o_t = t0 + gl.arange(0, STEP, layout=gl.SliceLayout(1, ROWS))  # [STEP] packed rows
    m_t = o_t < end
    b_ro = gl.load(p_ro + h * T + o_t, mask=m_t, other=0.0)  # [STEP]
    # dOt^: 16-token groups of dO ro
    _store_token_groups(p_dot_t, None, b_do * b_ro[:, None], None, cu_seqlens_t, doc, length, unit, h, T_t, D, T_ALIGN,
                        COLS)
    b_codes = _nvfp4_values(b_do, abs_max(b_do, 1), ROWS)
    gl.store(p_do_codes + o_x, b_codes.to(gl.bfloat16), mask=m_x)
    # D from the same quantized dO that dP uses (its exponents are 0)
    b_delta = gl.sum(b_codes * gl.load(p_o + o_x, mask=m_x, other=0.0).to(gl.float32), axis=1)  # [STEP]
    b_zero = gl.full([STEP], 0, gl.int8, layout=gl.SliceLayout(1, ROWS))
    gl.store(p_do_exps + o_t * H + h, b_zero, mask=m_t)
    gl.store(p_dot_exps + o_t * H + h, b_zero, mask=m_t)
    gl.store(p_delta + h * T + o_t, b_delta, mask=m_t)
    if RECORDS:
        store_query_records(p_rec, p_qe, p_pv, p_m, o_t, m_t, h, T, H, heads_kv, b_ro, b_zero.to(gl.int32),
                            b_delta, GROUP, SIGMA)
