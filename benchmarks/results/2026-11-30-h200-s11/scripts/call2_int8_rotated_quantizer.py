"""Session 11 call 2 (rejected): the shipped rotated quantizer with its transposed codes moved as int8 (wrong codes on
the H200, Triton 3.6); call 2 also launched it for V (HADAMARD_STAGES=0). Its qab.py compared V: Triton vs this kernel,
Q: the shipped kernel vs this one."""
"""The Q/K launch of the fused quantizer on the GPU, in Gluon: one thread per token row.

The Hadamard rotation pairs head-dim elements at distances 1 to D/2. In the Triton kernel
(``quantize._quantize_operand_kernel``) the compiler spreads a row over threads, so most
butterfly stages exchange values between threads (SHFL and FSEL on top of the adds): the
rotated launches ran at 1.1-1.7 TB/s against 3.4 TB/s without the rotation (H200, Triton 3.6,
2026-11-30). Gluon (``triton.experimental.gluon``, shipped with Triton 3.6) lets the kernel
name its layouts: here each thread holds a whole row of D fp32 values, so every stage of the
shared ``hadamard.rotate`` is in-register arithmetic (offline SASS, Triton 3.6: 7 FADD per
element, the minimum, no exchange; 1984 instructions per thread for 128 elements against
about 35 per element before; 167 registers, no spills), and the transposed codes leave
through one shared-memory transpose into 16-byte column stores. Kernel-only on the H200
(2026-11-30, bf16 [T, 16, 128], codes bitwise equal to the Triton kernel's): eq8x8k 0.316 ->
0.235 ms (2.29 TB/s), skew8k+224x256 0.330 -> 0.301, logu11-16k 0.088 -> 0.079, logu29-64k
0.330 -> 0.303 ms (1.78 TB/s); still below V's 3.4 TB/s. A row per thread also made every
16-byte load and store of a warp touch 32 rows (ncu: cache-bound), so the rows now arrive
and leave in coalesced layouts and change layout through shared memory (the codes as int8).
CUDA time of the Q and K launches together (H200, 2026-11-30, session 9 call 4, interleaved
medians of 5 rounds, codes bitwise unchanged): eq8x8k 0.465 -> 0.368 ms (2.92 TB/s),
skew8k+224x256 0.596 -> 0.400, logu29-64k 0.604 -> 0.393, eq4x4k 0.124 -> 0.094; with V's
launch the three quantizers move 3.08 TB/s on eq8x8k. Coalescing the loads alone: 0.396.

The arithmetic is the Triton kernel's, through the same helpers (``rotate``,
``block_exponents``, ``to_e4m3``; layout.py's ``unit_columns``, ``zero_tail``), so the codes
are equal bit for bit; the GPU tests check them against the torch reference. Gluon has no
CPU interpreter, so under TRITON_INTERPRET ``quantize_operand`` runs the Triton kernel,
which the CPU suite checks the same way.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .fp8 import block_exponents, pow2, to_e4m3
from .hadamard import rotate
from .layout import column_offsets, unit_columns, zero_tail
from .worklist import program_tile


@gluon.jit
def _rows(t0, end, h, H, UNIT: gl.constexpr, D: gl.constexpr, L: gl.constexpr):
    """Offsets [UNIT, D] (int64) of head h's elements of packed rows t0.. in [T, H, D], in
    layout L, and the mask of the rows before ``end``."""
    o_t = t0 + gl.arange(0, UNIT, layout=gl.SliceLayout(1, L))  # [UNIT]
    o_x = (o_t[:, None] * H + h) * D + gl.arange(0, D, layout=gl.SliceLayout(0, L))[None, :]
    return o_x, (o_t < end)[:, None]


@gluon.jit
def rotated_operand_kernel(p_x, p_codes, p_codes_t, p_exps, cu_seqlens, cu_seqlens_t, p_work, width, num_docs,
                            T_t, H, inv_sqrt_d, D: gl.constexpr, UNIT: gl.constexpr, BLOCK: gl.constexpr,
                            HADAMARD_STAGES: gl.constexpr, T_ALIGN: gl.constexpr):
    """Program ((document, unit), head), UNIT = 32 * num_warps tokens: the arguments and the
    outputs of ``quantize._quantize_operand_kernel`` with the rotation on and the transposed
    codes written."""
    # [UNIT, D]: a token row per thread, for the butterflies. LOAD and STORE: 16 bytes per
    # thread, consecutive threads along a row, so each warp reads and writes whole rows at once
    # (a row per thread left each 16-byte access in a different row: cache-bound, session 7's
    # ncu); the layout changes go through shared memory. [D, UNIT]: 16 consecutive tokens of
    # one head-dim element per thread, so each thread stores 16 bytes of the transposed codes.
    ROWS: gl.constexpr = gl.BlockedLayout([1, D], [32, 1], [gl.num_warps(), 1], [1, 0])
    LOAD: gl.constexpr = gl.BlockedLayout([1, 8], [256 // D, D // 8], [gl.num_warps(), 1], [1, 0])
    STORE: gl.constexpr = gl.BlockedLayout([1, 16], [512 // D, D // 16], [gl.num_warps(), 1], [1, 0])
    COLS: gl.constexpr = gl.BlockedLayout([1, 16], [32 * 16 // UNIT, UNIT // 16], [gl.num_warps(), 1], [1, 0])
    doc, unit = program_tile(p_work, width)
    if doc < 0:
        return
    h = gl.program_id(1).to(gl.int64)
    o_d = gl.arange(0, D, layout=gl.SliceLayout(1, COLS)).to(gl.int64)  # [D] head-dim rows of codes_t
    if unit == 0:
        o_j = gl.arange(0, 2 * T_ALIGN, layout=gl.SliceLayout(0, COLS))
        zero_tail(p_codes_t, cu_seqlens_t, doc, num_docs, h, o_d, o_j, T_t, D, T_ALIGN)
    start = gl.load(cu_seqlens + doc).to(gl.int64)
    end = gl.load(cu_seqlens + doc + 1).to(gl.int64)
    if start + unit * UNIT >= end:
        return
    # Rows past the document's end load as zeros: they add nothing to a block maximum.
    o_x, m_x = _rows(start + unit * UNIT, end, h, H, UNIT, D, LOAD)
    b_x = gl.convert_layout(gl.load(p_x + o_x, mask=m_x, other=0.0), ROWS)  # [UNIT, D]
    b_x = rotate(b_x.to(gl.float32), inv_sqrt_d, HADAMARD_STAGES)
    b_e = gl.convert_layout(block_exponents(b_x, BLOCK), gl.SliceLayout(1, ROWS))  # [UNIT]
    b_scaled = b_x * pow2(-b_e)[:, None]  # [UNIT, D]
    # The codes change layout as int8: as fp8, a layout change returned wrong codes (below).
    b_c = to_e4m3(b_scaled, False).to(gl.int8, bitcast=True)  # [UNIT, D]
    o_x, m_x = _rows(start + unit * UNIT, end, h, H, UNIT, D, STORE)
    gl.store(p_codes + o_x, gl.convert_layout(b_c, STORE).to(gl.float8e4nv, bitcast=True), mask=m_x)
    o_t = start + unit * UNIT + gl.arange(0, UNIT, layout=gl.SliceLayout(1, ROWS))  # [UNIT] packed rows
    gl.store(p_exps + o_t * H + h, b_e.to(gl.int8), mask=o_t < end)
    # [UNIT] this unit's columns of codes_t, valid up to its document's next multiple of T_ALIGN
    o_c, m_c = unit_columns(cu_seqlens_t, doc, (end - start).to(gl.int32),
                            unit * UNIT + gl.arange(0, UNIT, layout=gl.SliceLayout(0, COLS)), T_ALIGN)
    b_t = gl.convert_layout(gl.permute(b_c, [1, 0]), COLS).to(gl.float8e4nv, bitcast=True)  # [D, UNIT]
    gl.store(p_codes_t + column_offsets(o_d, o_c, h, T_t, D), b_t, mask=m_c[None, :])
