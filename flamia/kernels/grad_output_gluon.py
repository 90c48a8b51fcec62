"""The all-4-bit route's dO launch on the GPU, in Gluon: a thread per 16-element group.

The Triton launch (``quantize._quantize_grad_output_kernel`` with FP4) leaves the layouts to
the compiler, which spreads dO's 16-element NVFP4 groups and dO ro's 16-token groups over
threads, so every group maximum takes shuffles. Here the rows arrive with 16 consecutive
head-dim elements per thread (one NVFP4 group, 32 bytes of one row), and the transposed
values leave with 16 consecutive tokens of one head-dim row per thread (one token group, 32
bytes of one column run), the change between them going through shared memory once. Only a
row's maximum and its sum D cross threads.

The arithmetic is the Triton launch's, through the same helpers
(``rotated_quantizer.group_score_codes_in``, ``fp4.token_group_values``,
``records.store_query_records``), so the values are equal bit for bit; D sums the same
products in another order. Gluon has no CPU interpreter, so under
TRITON_INTERPRET ``quantize_grad_output`` runs the Triton launch.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .fp4 import token_group_values
from .fp4 import GROUP as NVFP4_GROUP
from .fp8 import E4M3_EQ, E4M3_MQ, abs_max, pow2, scale_exponent
from .launch import PACKING_INTS
from .layout import column_offsets, unit_columns, zero_padding
from .records import store_query_records
from .rotated_quantizer import group_score_codes_in, packed_rows
from .worklist import program_tile


@gluon.jit
def _nvfp4_values(b_x, ROWS: gl.constexpr):
    """``fp4.nvfp4_values`` of rows b_x [U, D] fp32 in layout ROWS, whose threads each hold one
    16-element group: [U, D] fp32 in ROWS."""
    D: gl.constexpr = b_x.shape[1]
    GROUPS: gl.constexpr = gl.BlockedLayout([1, 1, NVFP4_GROUP], [512 // D, D // NVFP4_GROUP, 1],
                                            [gl.num_warps(), 1, 1], [2, 1, 0])
    b_e = scale_exponent(abs_max(b_x, 1), E4M3_EQ, E4M3_MQ)  # [U] each token's NVFP4 exponent
    return gl.convert_layout(group_score_codes_in(b_x, b_e, GROUPS), ROWS) * pow2(b_e)[:, None]


@gluon.jit(do_not_specialize=PACKING_INTS)
def fp4_grad_output_kernel(p_do, p_o, p_ro, p_do_codes, p_do_exps, p_dot_t, p_dot_exps, p_delta,
                           cu_seqlens, cu_seqlens_t, p_work, width, num_docs, T, T_t, H,
                           p_qe, p_pv, p_m, p_rec, heads_kv, D: gl.constexpr, STEP: gl.constexpr,
                           RECORDS: gl.constexpr, GROUP: gl.constexpr, SIGMA: gl.constexpr,
                           T_ALIGN: gl.constexpr):
    """Program ((document, unit of STEP tokens), head): the arguments and outputs of
    ``quantize._quantize_grad_output_kernel`` with FP4 on (GROUP: query heads per KV head).
    D <= 512 and 16 <= STEP <= 512, powers of two."""
    # [STEP, D]: 16 consecutive head-dim elements per thread, the rows' threads side by side
    ROWS: gl.constexpr = gl.BlockedLayout([1, NVFP4_GROUP], [512 // D, D // NVFP4_GROUP], [gl.num_warps(), 1], [1, 0])
    # [D, STEP]: 16 consecutive tokens of one head-dim row per thread
    COLS: gl.constexpr = gl.BlockedLayout([1, 16], [512 // STEP, STEP // 16], [gl.num_warps(), 1], [1, 0])
    doc, unit = program_tile(p_work, width)
    if doc < 0:
        return
    h = gl.program_id(1).to(gl.int64)
    start = gl.load(cu_seqlens + doc).to(gl.int64)
    end = gl.load(cu_seqlens + doc + 1).to(gl.int64)
    o_d = gl.arange(0, D, layout=gl.SliceLayout(1, COLS)).to(gl.int64)  # [D] head-dim rows of dot_t
    if unit == 0:
        zero_padding(p_dot_t, cu_seqlens_t, doc, (end - start).to(gl.int32), num_docs, h, o_d,
                     gl.arange(0, 2 * T_ALIGN, layout=gl.SliceLayout(0, COLS)), T_t, D, T_ALIGN)
    t0 = start + unit * STEP
    if t0 >= end:
        return
    # Rows past the document's end load as zeros: their values and their columns' are 0.
    o_x, m_x = packed_rows(t0, end, h, H, STEP, D, ROWS)  # [STEP, D]
    b_do = gl.load(p_do + o_x, mask=m_x, other=0.0).to(gl.float32)  # [STEP, D]
    b_codes = _nvfp4_values(b_do, ROWS)
    gl.store(p_do_codes + o_x, b_codes.to(gl.bfloat16), mask=m_x)
    # D from the same quantized dO that dP uses (its exponents are 0)
    b_delta = gl.sum(b_codes * gl.load(p_o + o_x, mask=m_x, other=0.0).to(gl.float32), axis=1)  # [STEP]
    o_t = t0 + gl.arange(0, STEP, layout=gl.SliceLayout(1, ROWS))  # [STEP] packed rows
    m_t = o_t < end
    b_ro = gl.load(p_ro + h * T + o_t, mask=m_t, other=0.0)  # [STEP]
    b_zero = gl.full([STEP], 0, gl.int8, layout=gl.SliceLayout(1, ROWS))
    gl.store(p_do_exps + o_t * H + h, b_zero, mask=m_t)
    gl.store(p_dot_exps + o_t * H + h, b_zero, mask=m_t)
    gl.store(p_delta + h * T + o_t, b_delta, mask=m_t)
    # dOt^: 16-token groups of dO ro, tokens in their own order (BF16's)
    b_t = gl.convert_layout(gl.permute(b_do * b_ro[:, None], [1, 0]), COLS)  # [D, STEP]
    b_t = gl.convert_layout(token_group_values(b_t), COLS)
    o_c, m_c = unit_columns(cu_seqlens_t, doc, (end - start).to(gl.int32),
                            unit * STEP + gl.arange(0, STEP, layout=gl.SliceLayout(0, COLS)), T_ALIGN)
    gl.store(p_dot_t + column_offsets(o_d, o_c, h, T_t, D), b_t.to(gl.bfloat16), mask=m_c[None, :])
    if RECORDS:
        store_query_records(p_rec, p_qe, p_pv, p_m, o_t, m_t, h, T, H, heads_kv, b_ro, b_zero.to(gl.int32),
                            b_delta, GROUP, SIGMA)
