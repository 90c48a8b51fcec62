"""The fused token-block E4M3 quantizer of the MXFP8 route (NUMERICS.md 2 and 4), and with
``fmt=BF16`` the BF16 recipe's operand copies: the same launches write bf16 values and zero
exponents (``CODES``, the operand format of ``configs.OperandFormat``).

One launch reads an operand once and writes every orientation the attention kernels need:
row-major codes [T, H, D] (K-major for products over the head dim), transposed codes
[H, D, T_t] (K-major for products over tokens, every document starting at a multiple of 32
columns: layout.py) and dense per-token exponents [T, H]. The dO launch adds the second
representation dOt^ and the softmax-gradient row term D.

Programs map to ((document, unit), head) through the grid (W, H) and a ``worklist.tile_list``
of W entries: a unit is UNIT consecutive tokens starting at its document's start plus a
multiple of UNIT, so it holds whole scale blocks of one document (and, UNIT being a multiple
of 16, the zero codes of its document's last transposed columns); every document, an empty
one too, has a unit 0. Nothing is read back to the host. ``cu_seqlens[-1]`` must equal T
(rows outside every document are not written).
The torch reference these match bit for bit is ``flamia/reference/operands.py``.

``FP4`` switches the same kernels (with ``fmt=BF16``) to the all-4-bit route's decoded values
(NUMERICS.md 6; the launchers and the reference are ``quantize_fp4.py``'s): NVFP4 rows, the
token-axis values in 16-token groups in the transposed layout and, where a per-token
pointer is given, the diagonal tiles' per-token values; exponents, records and D as BF16's.
"""
import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..formats.hadamard import HADAMARD_DIMS
from ..validation import INPUT_DTYPES
from .configs import BF16, E4M3, QUANTIZER, OperandFormat
from .fp4 import e2m1_pow2, nvfp4_values, score_codes, token_group_values
from .fp8 import abs_max, block_exponents, code_grid, inf_to_nan, interpreting, pow2, to_codes, to_fp32, to_output
from .hadamard import rotate
from .layout import (T_ALIGN, aligned_starts, check_operand, column_offsets, mma_token_order,
                     transposed_extent, unit_columns, zero_padding)
from .fp4_quantizer_gluon import fp4_grad_output_kernel, fp4_operand_kernel
from .rotated_quantizer import rotated_operand_kernel
from .worklist import list_extent, program_tile, program_tile_within, tile_list
from .launch import PACKING_INTS, launch
from .records import check_sigma, store_query_records

@dataclass(frozen=True)
class KernelOperand:
    """A token-block E4M3 operand (or a BF16 one, exponents 0) as the attention kernels read it.
    codes: [T, H, D] float8_e4m3fn (bfloat16); codes_t: [H, D, T_t], the same codes with
    tokens contiguous in the layout of ``layout.py`` (zero outside documents), or None;
    exps: [T, H] int8, value = codes * 2^exps; cu_seqlens_t: int32 [num_docs + 1], the
    documents' first columns in codes_t (``aligned_starts``), or None; work: the launch's
    ``tile_list`` (int32 [2, W]; None without tokens), which another operand launch over the
    same cu_seqlens can reuse; key_rec: ``records.key_records(key_exps, exps)`` [H, T] int32
    when the launch was given K's exponents (V's launch), else None."""

    codes: torch.Tensor
    codes_t: torch.Tensor | None
    exps: torch.Tensor
    cu_seqlens_t: torch.Tensor | None
    work: torch.Tensor | None
    key_rec: torch.Tensor | None = None


@dataclass(frozen=True)
class KernelGradOutput:
    """What the dO launch writes (NUMERICS.md 4).
    do_codes: [T, H, D] float8_e4m3fn (bfloat16 in the BF16 format) and do_exps: [T, H] int8, dO^ in token blocks;
    dot_codes_t: [H, D, T_t] float8_e4m3fn, e4m3((dO * ro) * 2^-edOt) in the layout of
    ``layout.py`` (zero outside documents; None where not written), its document starts cu_seqlens_t int32
    [num_docs + 1]; dot_exps: [T, H] int8, edOt, one per (query step, head) repeated per
    token; delta: [H, T] fp32, D(i) = sum_d (dO^ * 2^edO)(i, d) * O(i, d); records:
    ``records.query_records`` [H, T, 4] int32 when the launch was given Q's exponents, PV
    and m, else None."""

    do_codes: torch.Tensor
    do_exps: torch.Tensor
    dot_codes_t: torch.Tensor | None
    dot_exps: torch.Tensor
    delta: torch.Tensor
    cu_seqlens_t: torch.Tensor
    records: torch.Tensor | None = None


@triton.jit
def _unit_rows(cu_seqlens, doc, unit, UNIT: tl.constexpr):
    """Packed rows of unit ``unit`` of document ``doc``: (first row, end of its document,
    rows [UNIT], valid [UNIT]); int64."""
    start = tl.load(cu_seqlens + doc).to(tl.int64) + unit.to(tl.int64) * UNIT
    end = tl.load(cu_seqlens + doc + 1).to(tl.int64)
    o_t = start + tl.arange(0, UNIT)
    return start, end, o_t, o_t < end


@triton.jit
def _unit_cols(cu_seqlens, cu_seqlens_t, doc, unit, UNIT: tl.constexpr, T_ALIGN: tl.constexpr):
    """Transposed-codes columns of unit ``unit`` of document ``doc`` (``layout.unit_columns``):
    (cols [UNIT] int64, valid [UNIT])."""
    length = tl.load(cu_seqlens + doc + 1) - tl.load(cu_seqlens + doc)
    return unit_columns(cu_seqlens_t, doc, length, unit * UNIT + tl.arange(0, UNIT), T_ALIGN)


@triton.jit
def _row_offsets(o_t, h, H, D: tl.constexpr):
    """Element offsets [UNIT, D] of rows o_t, head h in a contiguous [T, H, D] tensor."""
    return (o_t[:, None] * H + h) * D + tl.arange(0, D)[None, :]


@triton.jit
def _store_transposed(p_t, b_t, cols, h, T_t, D: tl.constexpr, CODES: tl.constexpr, INTERPRET: tl.constexpr):
    """Store the codes (format CODES) of b_t [D, UNIT] fp32 (already scaled, tokens in order)
    at columns cols = ``_unit_cols`` (o_c [UNIT], valid [UNIT]) of head h of a [H, D, T_t]
    tensor, each 16 tokens in the layout's MMA order (``mma_token_order``)."""
    o_c, m_c = cols
    tl.store(p_t + column_offsets(tl.arange(0, D).to(tl.int64), o_c, h, T_t, D),
             to_codes(mma_token_order(b_t, CODES), CODES, INTERPRET), mask=m_c[None, :])


@triton.jit
def _exponents(b_x, BLOCK: tl.constexpr, CODES: tl.constexpr):
    """[U] int32 scale exponents of b_x [U, D] fp32, one per BLOCK rows (``block_exponents``);
    BF16 values take none: 0."""
    if CODES == tl.bfloat16:
        b_e = tl.zeros([b_x.shape[0]], tl.int32)
    else:
        b_e = block_exponents(b_x, BLOCK)
    return b_e


@triton.jit
def _code_range(b_x, b_f, CODES: tl.constexpr):
    """b_x scaled by b_f (``pow2(-e)``, broadcast to b_x) into the codes' range, +-inf made
    NaN (``inf_to_nan``); BF16: b_x itself, whose bf16 cast keeps an Inf, as torch's does."""
    if CODES != tl.bfloat16:
        b_x = inf_to_nan(b_x * b_f)
    return b_x


@triton.jit
def _zero_padding(p_t, cu_seqlens, cu_seqlens_t, doc, unit, num_docs, h, T_t, D: tl.constexpr, T_ALIGN: tl.constexpr):
    """``layout.zero_padding`` in unit 0: zero document doc's padding columns and its share of
    the tail of head h of a [H, D, T_t] tensor."""
    if unit == 0:
        length = tl.load(cu_seqlens + doc + 1) - tl.load(cu_seqlens + doc)
        zero_padding(p_t, cu_seqlens_t, doc, length, num_docs, h, tl.arange(0, D).to(tl.int64),
                     tl.arange(0, 2 * T_ALIGN), T_t, D, T_ALIGN)


@triton.jit
def _quantize_unit(p_x, p_codes, p_codes_t, p_exps, cu_seqlens, cu_seqlens_t, p_work, width, T_t, H, h, num_docs,
                   inv_sqrt_d, p_key_exps, p_key_rec, p_diag_t, T, D: tl.constexpr, UNIT: tl.constexpr,
                   BLOCK: tl.constexpr, HADAMARD_STAGES: tl.constexpr, TRANSPOSED: tl.constexpr, KEY_REC: tl.constexpr,
                   SCORES: tl.constexpr, FP4: tl.constexpr, T_ALIGN: tl.constexpr, CODES: tl.constexpr,
                   INTERPRET: tl.constexpr):
    """This program's unit of head h (int64) of one operand. FP4 (CODES bf16): the all-4-bit
    route's decoded values, with p_diag_t (None: not written) the per-token ones."""
    doc, unit = program_tile_within(p_work, width)
    if doc < 0:
        return
    if TRANSPOSED:
        _zero_padding(p_codes_t, cu_seqlens, cu_seqlens_t, doc, unit, num_docs, h, T_t, D, T_ALIGN)
        if p_diag_t is not None:
            _zero_padding(p_diag_t, cu_seqlens, cu_seqlens_t, doc, unit, num_docs, h, T_t, D, T_ALIGN)
    start, end, o_t, m_t = _unit_rows(cu_seqlens, doc, unit, UNIT)
    if start >= end:
        return
    o_x = _row_offsets(o_t, h, H, D)  # [UNIT, D]
    # Rows past the document's end load as zeros: they add nothing to a block maximum.
    b_x = to_fp32(tl.load(p_x + o_x, mask=m_t[:, None], other=0.0), INTERPRET)  # [UNIT, D]
    b_x = rotate(b_x, inv_sqrt_d, HADAMARD_STAGES)
    b_e = _exponents(b_x, BLOCK, CODES)  # [UNIT]
    b_scaled = _code_range(b_x, pow2(-b_e)[:, None], CODES)
    if FP4:  # the row-major values are NVFP4's, with each token's own scale folded in
        b_amax = abs_max(b_x, 1)  # [UNIT]
        tl.store(p_codes + o_x, to_codes(nvfp4_values(b_x, b_amax, D), CODES, INTERPRET), mask=m_t[:, None])
    elif SCORES == 1:  # the mixed NVFP4 route: the row-major codes are the scores' bf16 codes
        tl.store(p_codes + o_x, to_output(score_codes(b_x, b_e, D), tl.bfloat16, INTERPRET), mask=m_t[:, None])
    elif SCORES == 2:  # bf16_scores: x on the E4M3 codes' exponents in BF16, an Inf kept as torch's cast does
        tl.store(p_codes + o_x, to_output(b_x * pow2(-b_e)[:, None], tl.bfloat16, INTERPRET), mask=m_t[:, None])
    else:
        tl.store(p_codes + o_x, to_codes(b_scaled, CODES, INTERPRET), mask=m_t[:, None])
    tl.store(p_exps + o_t * H + h, b_e.to(tl.int8), mask=m_t)
    if KEY_REC:
        # records.key_records of K's stored exponents and these (as stored, int8); the
        # all-4-bit route's K stores zeros, and the bf16 route's own bf16 K has none (None)
        if FP4 or p_key_exps is None:
            e_k = tl.zeros([UNIT], tl.int32)
        else:
            e_k = tl.load(p_key_exps + o_t * H + h, mask=m_t, other=0).to(tl.int32)
        e_v = b_e.to(tl.int8).to(tl.int32)
        tl.store(p_key_rec + h * T + o_t, ((e_k + 127) << 23) | ((e_v + 127) << 15), mask=m_t)
    if TRANSPOSED:
        if HADAMARD_STAGES > 0:
            b_t = tl.trans(b_scaled)  # [D, UNIT]
        else:
            # Re-read x in the transposed layout (an L2 hit) instead of transposing registers:
            # Triton 3.6 miscompiles the register transpose of an unrotated tile (wrong codes),
            # while the rotated tile's (after the butterflies) stores right ones.
            b_t = _code_range(to_fp32(tl.load(p_x + tl.trans(o_x), mask=m_t[None, :], other=0.0), INTERPRET),
                              pow2(-b_e)[None, :], CODES)
        cols = _unit_cols(cu_seqlens, cu_seqlens_t, doc, unit, UNIT, T_ALIGN)
        if FP4:  # b_t is x itself here (bf16 codes take no exponent)
            if p_diag_t is not None:  # the per-token scales of diagonal tiles
                _store_transposed(p_diag_t, e2m1_pow2(b_t, b_amax[None, :]), cols, h, T_t, D, CODES, INTERPRET)
            b_t = token_group_values(b_t)
        _store_transposed(p_codes_t, b_t, cols, h, T_t, D, CODES, INTERPRET)


@triton.jit(do_not_specialize=PACKING_INTS)
def _quantize_operand_kernel(p_x, p_codes, p_codes_t, p_exps, cu_seqlens, cu_seqlens_t, p_work, width, T_t, H,
                             p_x2, p_codes2, p_codes_t2, p_exps2, cu_seqlens2, cu_seqlens_t2, p_work2, width2, T_t2,
                             H2, num_docs, inv_sqrt_d, p_key_exps, p_key_rec, p_diag_t, p_diag_t2, T,
                             D: tl.constexpr, UNIT: tl.constexpr, BLOCK: tl.constexpr, HADAMARD_STAGES: tl.constexpr,
                             TRANSPOSED: tl.constexpr, KEY_REC: tl.constexpr, PAIR: tl.constexpr,
                             SCORES: tl.constexpr, FP4: tl.constexpr, T_ALIGN: tl.constexpr, CODES: tl.constexpr,
                             INTERPRET: tl.constexpr):
    """Program ((document, unit), head). PAIR: heads H.. of the grid quantize a second operand
    (the arguments ending in 2, its head h - H), so Q and K take one launch. FP4: the
    all-4-bit route (``_quantize_unit``); p_diag_t, p_diag_t2: each operand's per-token values
    [H, D, T_t] bf16, or None."""
    h = tl.program_id(1).to(tl.int64)
    if PAIR and h >= H:
        _quantize_unit(p_x2, p_codes2, p_codes_t2, p_exps2, cu_seqlens2, cu_seqlens_t2, p_work2, width2, T_t2, H2,
                       h - H, num_docs, inv_sqrt_d, p_key_exps, p_key_rec, p_diag_t2, T, D, UNIT, BLOCK,
                       HADAMARD_STAGES, TRANSPOSED, KEY_REC, SCORES, FP4, T_ALIGN, CODES, INTERPRET)
    else:
        _quantize_unit(p_x, p_codes, p_codes_t, p_exps, cu_seqlens, cu_seqlens_t, p_work, width, T_t, H, h,
                       num_docs, inv_sqrt_d, p_key_exps, p_key_rec, p_diag_t, T, D, UNIT, BLOCK, HADAMARD_STAGES,
                       TRANSPOSED, KEY_REC, SCORES, FP4, T_ALIGN, CODES, INTERPRET)


@triton.jit(do_not_specialize=PACKING_INTS)
def _quantize_grad_output_kernel(p_do, p_o, p_ro, p_do_codes, p_do_exps, p_dot_t, p_dot_exps, p_delta,
                                 cu_seqlens, cu_seqlens_t, p_work, width, num_docs, T, T_t, H,
                                 p_qe, p_pv, p_m, p_rec, heads_kv, D: tl.constexpr, STEP: tl.constexpr,
                                 BLOCK: tl.constexpr, RECORDS: tl.constexpr, GROUP: tl.constexpr,
                                 SIGMA: tl.constexpr, FP4: tl.constexpr, TRANSPOSED: tl.constexpr,
                                 ROW_CODES: tl.constexpr, T_ALIGN: tl.constexpr, CODES: tl.constexpr,
                                 DOT_VALUES: tl.constexpr, INTERPRET: tl.constexpr):
    """Program ((document, unit of STEP tokens), head). FP4 (CODES bf16, exponents 0): the
    all-4-bit route's decoded values, dO^ in NVFP4 and dOt^ in 16-token groups. TRANSPOSED:
    write dOt^ (p_dot_t); its exponents are written either way. ROW_CODES: write dO^ (else
    dO is its own BF16 codes, ``quantize_grad_output``'s own_codes); its exponents either way.
    DOT_VALUES (E4M3 codes): dOt^ as BF16 values, its codes times 2^edOt (exact)."""
    doc, unit = program_tile(p_work, width)
    if doc < 0:
        return
    h = tl.program_id(1).to(tl.int64)
    if TRANSPOSED:
        _zero_padding(p_dot_t, cu_seqlens, cu_seqlens_t, doc, unit, num_docs, h, T_t, D, T_ALIGN)
    start, end, o_t, m_t = _unit_rows(cu_seqlens, doc, unit, STEP)
    if start >= end:
        return
    o_x = _row_offsets(o_t, h, H, D)  # [STEP, D]
    b_do = to_fp32(tl.load(p_do + o_x, mask=m_t[:, None], other=0.0), INTERPRET)  # [STEP, D]
    b_e = _exponents(b_do, BLOCK, CODES)  # [STEP]
    if FP4:  # each token's own NVFP4 scale folded in
        b_codes = to_codes(nvfp4_values(b_do, abs_max(b_do, 1), D), CODES, INTERPRET)
    else:
        b_codes = to_codes(_code_range(b_do, pow2(-b_e)[:, None], CODES), CODES, INTERPRET)
    if ROW_CODES:
        tl.store(p_do_codes + o_x, b_codes, mask=m_t[:, None])
    tl.store(p_do_exps + o_t * H + h, b_e.to(tl.int8), mask=m_t)
    # D from the same quantized dO that dP uses: (codes * 2^edO) * O, summed over the head dim.
    b_o = to_fp32(tl.load(p_o + o_x, mask=m_t[:, None], other=0.0), INTERPRET)  # [STEP, D]
    b_delta = tl.sum((to_fp32(b_codes, INTERPRET) * pow2(b_e)[:, None]) * b_o, axis=1)  # [STEP]
    tl.store(p_delta + h * T + o_t, b_delta, mask=m_t)
    # dOt^: the per-query factor ro folded in, one exponent over the whole query step.
    b_ro = tl.load(p_ro + h * T + o_t, mask=m_t, other=0.0)  # [STEP]
    b_dot = b_do * b_ro[:, None]
    b_et = _exponents(b_dot, STEP, CODES)
    b_dot = _code_range(b_dot, pow2(-b_et)[:, None], CODES)
    tl.store(p_dot_exps + o_t * H + h, b_et.to(tl.int8), mask=m_t)
    if TRANSPOSED:
        b_dot = tl.trans(b_dot)  # [D, STEP]
        if FP4:
            b_dot = token_group_values(b_dot)
        DOT_CODES: tl.constexpr = tl.bfloat16 if DOT_VALUES else CODES
        if DOT_VALUES:  # the codes' values on their step's scale: powers of two, exact in BF16
            b_dot = code_grid(b_dot, CODES, INTERPRET) * pow2(b_et)[None, :]
        _store_transposed(p_dot_t, b_dot, _unit_cols(cu_seqlens, cu_seqlens_t, doc, unit, STEP, T_ALIGN), h, T_t, D,
                          DOT_CODES, INTERPRET)
    if RECORDS:  # records.query_records of these rows, from the values stored above (exponents as int8)
        store_query_records(p_rec, p_qe, p_pv, p_m, o_t, m_t, h, T, H, heads_kv, b_ro,
                            b_e.to(tl.int8).to(tl.int32), b_delta, GROUP, SIGMA)


def _check_rows(x: torch.Tensor, name: str) -> None:
    if x.dim() != 3 or x.dtype not in INPUT_DTYPES or not x.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous [T, H, D] tensor of dtype in {INPUT_DTYPES}, "
                         f"got shape {tuple(x.shape)}, dtype {x.dtype}, contiguous={x.is_contiguous()}")
    d = x.shape[2]
    if d < 16 or d & (d - 1):
        raise ValueError(f"{name}: head dim must be a power of two >= 16, got {d}")


def _check_divisor(n: int, of: int, name: str) -> None:
    """n must be a power of two (a tl.arange extent or a reshape factor) dividing ``of``."""
    if n < 1 or n & (n - 1) or of % n:
        raise ValueError(f"{name}: must be a power of two dividing {of}, got {n}")


def _work_list(cu_seqlens: torch.Tensor, total: int, unit: int, work: torch.Tensor | None = None) -> torch.Tensor:
    """``work`` checked, or built when None (``worklist.tile_list`` of units of ``unit``
    tokens, every document with a unit 0); no host sync."""
    if work is None:
        work = tile_list(cu_seqlens, total, unit, reverse=False, empty_docs=True)
    check_operand("work", work, torch.int32, (2, list_extent(total, cu_seqlens.numel() - 1, unit)))
    return work


def _units(cu_seqlens: torch.Tensor, total: int, unit: int, heads: int,
           work: torch.Tensor | None = None) -> tuple[tuple[int, int], dict]:
    """The grid (W, heads) and the kernels' work arguments (``_work_list``)."""
    work = _work_list(cu_seqlens, total, unit, work)
    return (work.shape[1], heads), dict(p_work=work, width=work.shape[1], num_docs=cu_seqlens.numel() - 1)


def _transposed_codes(heads: int, d: int, total: int, cu_seqlens: torch.Tensor, fmt: OperandFormat) -> torch.Tensor:
    """[H, D, T_t] codes for a launch that writes every column (documents, their gaps and the
    tail); without tokens there is no launch, so the columns are zeroed here."""
    shape = (heads, d, transposed_extent(total, cu_seqlens.numel() - 1))
    alloc = torch.empty if total else torch.zeros
    return alloc(shape, dtype=fmt.torch_dtype, device=cu_seqlens.device)


class _Side(NamedTuple):
    """One operand of a quantizer launch: its input x [T, H, D], document starts, the outputs
    (uninitialised until the launch), its work list (None without tokens) and, on the
    all-4-bit route, its per-token values diag_t [H, D, T_t] (or None)."""

    x: torch.Tensor
    cu_seqlens: torch.Tensor
    codes: torch.Tensor
    codes_t: torch.Tensor | None
    exps: torch.Tensor
    cu_seqlens_t: torch.Tensor | None
    work: torch.Tensor | None
    diag_t: torch.Tensor | None = None

    @classmethod
    def allocate(cls, x: torch.Tensor, cu_seqlens: torch.Tensor, transposed: bool, cu_seqlens_t: torch.Tensor | None,
                 work: torch.Tensor | None, fmt: OperandFormat, row_dtype: torch.dtype,
                 diagonal: bool = False) -> "_Side":
        """Row codes in row_dtype, transposed codes in fmt (when ``transposed``; diag_t too
        when ``diagonal``), exponents."""
        total, heads, d = x.shape
        codes_t, cu_t, diag_t = None, None, None
        if transposed:
            cu_t = aligned_starts(cu_seqlens) if cu_seqlens_t is None else cu_seqlens_t
            codes_t = _transposed_codes(heads, d, total, cu_seqlens, fmt)
            if diagonal:
                diag_t = _transposed_codes(heads, d, total, cu_seqlens, fmt)
        if total:
            work = _work_list(cu_seqlens, total, QUANTIZER.operand_unit, work)
        return cls(x, cu_seqlens, torch.empty((total, heads, d), dtype=row_dtype, device=x.device), codes_t,
                   torch.empty((total, heads), dtype=torch.int8, device=x.device), cu_t, work, diag_t)

    def kernel_args(self) -> list:
        """The kernel's ten arguments of one operand, p_x .. H."""
        t_t = 0 if self.codes_t is None else self.codes_t.shape[2]
        return [self.x, self.codes, self.codes_t, self.exps, self.cu_seqlens, self.cu_seqlens_t, self.work,
                self.work.shape[1], t_t, self.x.shape[1]]

    def operand(self, key_rec: torch.Tensor | None = None) -> KernelOperand:
        return KernelOperand(self.codes, self.codes_t, self.exps, self.cu_seqlens_t, self.work, key_rec)


def _launch_operands(sides: list[_Side], block: int, hadamard: bool, transposed: bool, fmt: OperandFormat,
                     scores: int = 0, key_exps: torch.Tensor | None = None,
                     key_rec: torch.Tensor | None = None, fp4: bool = False) -> None:
    """One launch over one or two operands (each with tokens; one head dim and one dtype).
    scores: what the row codes hold (``Route.score_codes``); key_rec: written from key_exps,
    or (fp4) from zero exponents; fp4: the all-4-bit route (fmt BF16)."""
    args = [arg for side in sides for arg in side.kernel_args()]
    pair = len(sides) == 2
    args += [None] * 10 * (not pair)
    grid = (max(side.work.shape[1] for side in sides), sum(side.x.shape[1] for side in sides))
    d = sides[0].x.shape[2]
    common = dict(num_docs=sides[0].cu_seqlens.numel() - 1, inv_sqrt_d=1.0 / math.sqrt(d), D=d,
                  UNIT=QUANTIZER.operand_unit, BLOCK=block, HADAMARD_STAGES=d.bit_length() - 1 if hadamard else 0,
                  T_ALIGN=T_ALIGN, PAIR=pair)
    nvfp4 = scores == 1 or fp4  # the launches that form NVFP4 groups
    if fp4 and not hadamard and d <= 128 and transposed and not interpreting():
        # a thread per 16-element group, 16 tokens per thread transposed (fp4_quantizer_gluon.py)
        unit = QUANTIZER.operand_unit
        launch(fp4_operand_kernel, grid, *args, num_docs=common["num_docs"], p_diag_t=sides[0].diag_t,
               p_diag_t2=sides[1].diag_t if pair else None, p_key_rec=key_rec, T=sides[0].x.shape[0], D=d, UNIT=unit,
               T_ALIGN=T_ALIGN, PAIR=pair, num_warps=_group_warps(unit, d))
        return
    if (hadamard or (nvfp4 and d <= 128)) and transposed and key_rec is None and not interpreting():
        # a token row per thread, so the butterflies and NVFP4's groups stay in registers
        # (rotated_quantizer.py; the rotation may be off). Wider unrotated rows take the Triton
        # kernel: a row per thread spills at d=256 and its layouts end at d=256.
        launch(rotated_operand_kernel, grid, *args, **common, PARTS=QUANTIZER.transposed_parts,
               p_diag_t=sides[0].diag_t, p_diag_t2=sides[1].diag_t if pair else None, SCORES=scores, FP4=fp4,
               num_warps=QUANTIZER.rotated_warps)
        return
    warps = QUANTIZER.nvfp4_warps if nvfp4 else QUANTIZER.rotated_warps if hadamard else QUANTIZER.plain_warps
    launch(_quantize_operand_kernel, grid, *args, **common, p_key_exps=key_exps, p_key_rec=key_rec,
           p_diag_t=sides[0].diag_t, p_diag_t2=sides[1].diag_t if pair else None, T=sides[0].x.shape[0],
           TRANSPOSED=transposed, KEY_REC=key_rec is not None, SCORES=scores, FP4=fp4, CODES=fmt.codes,
           INTERPRET=interpreting(), num_warps=warps)


def _check_options(x: torch.Tensor, block: int, hadamard: bool, fmt: OperandFormat) -> None:
    _check_rows(x, "x")
    _check_divisor(block, QUANTIZER.operand_unit, "block")
    if hadamard and x.shape[2] not in HADAMARD_DIMS:
        raise ValueError(f"hadamard: head dim must be one of {HADAMARD_DIMS}, got {x.shape[2]}")
    if hadamard and fmt != E4M3:
        raise ValueError(f"hadamard: the rotated quantizer writes E4M3 codes, got the {fmt.name} format")


def quantize_operand(x: torch.Tensor, cu_seqlens: torch.Tensor, block: int = 32,
                     hadamard: bool = False, transposed: bool = True,
                     cu_seqlens_t: torch.Tensor | None = None, work: torch.Tensor | None = None,
                     key_exps: torch.Tensor | None = None, fmt: OperandFormat = E4M3,
                     key_records: bool = False) -> KernelOperand:
    """Q, K or V -> token-block E4M3 (``fmt=BF16``: bf16 values, exponents 0) in one launch.
    x: [T, H, D] bf16/fp16/fp32, contiguous;
    cu_seqlens: int32 [num_docs + 1] on x's device; block: tokens per scale block (32, or 1
    for per-token scales); hadamard: rotate the head dim first (NUMERICS.md 2);
    transposed: also write codes_t; cu_seqlens_t: ``aligned_starts(cu_seqlens)`` if the
    caller has it (K's serves V), else computed here; work: the ``KernelOperand.work`` of an
    earlier launch over the same cu_seqlens (Q's serves K and V in self-attention), else
    built here; key_exps: K's exponents [T, H] int8 when x is V: the launch also writes the
    key records (``KernelOperand.key_rec``), saving their own launch; fmt: the codes' format
    (the BF16 format has no rotated launch); key_records: the key records without key_exps, for
    K codes that carry no exponents (BF16: eK = 0)."""
    _check_options(x, block, hadamard, fmt)
    total, heads, _ = x.shape
    side = _Side.allocate(x, cu_seqlens, transposed, cu_seqlens_t, work, fmt, fmt.torch_dtype)
    key_rec = None
    if key_exps is not None:
        check_operand("key_exps", key_exps, torch.int8, (total, heads))
    elif key_records and fmt != BF16:
        raise ValueError(f"key_exps: the key records of {fmt.name} codes need K's exponents, got None")
    if key_exps is not None or key_records:
        key_rec = torch.empty((heads, total), dtype=torch.int32, device=x.device)
    if total:
        _launch_operands([side], block, hadamard, transposed, fmt, key_exps=key_exps, key_rec=key_rec)
    return side.operand(key_rec)


def quantize_pair(q: torch.Tensor, k: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                  block: int = 32, hadamard: bool = False, cu_seqlens_qt: torch.Tensor | None = None,
                  cu_seqlens_kt: torch.Tensor | None = None, q_work: torch.Tensor | None = None,
                  k_work: torch.Tensor | None = None, fmt: OperandFormat = E4M3,
                  scores: int = 0, transposed: bool = True) -> tuple[KernelOperand, KernelOperand]:
    """Q and K -> ``quantize_operand(x, cu_seqlens, block, hadamard, transposed, cu_seqlens_t,
    work, fmt=fmt)`` of each, in one launch (two when either has no tokens). q [Tq, Hq, D] and k
    [Tk, Hkv, D] share a dtype and a head dim; cu_seqlens_q and cu_seqlens_k a document count.
    scores (fmt E4M3; ``Route.score_codes``): the row-major codes are the scores' bf16 codes
    on the tokens' E4M3 exponents, 1 NVFP4 values (the mixed route, ``fp4.score_codes``), 2
    x itself (``Recipe.bf16_scores``); the transposed codes stay E4M3."""
    _check_options(q, block, hadamard, fmt)
    _check_options(k, block, hadamard, fmt)
    _check_pair(q, k, cu_seqlens_q, cu_seqlens_k)
    if scores not in (0, 1, 2):
        raise ValueError(f"scores: 0 (codes), 1 (NVFP4 values) or 2 (BF16 codes), got {scores!r}")
    if scores and fmt != E4M3:
        raise ValueError(f"scores: bf16 score codes come with E4M3 transposed codes, got the {fmt.name} format")
    row_dtype = torch.bfloat16 if scores else fmt.torch_dtype
    sides = [_Side.allocate(q, cu_seqlens_q, transposed, cu_seqlens_qt, q_work, fmt, row_dtype),
             _Side.allocate(k, cu_seqlens_k, transposed, cu_seqlens_kt, k_work, fmt, row_dtype)]
    _launch_pair(sides, block, hadamard, fmt, scores, transposed=transposed)
    return sides[0].operand(), sides[1].operand()


def _check_pair(q: torch.Tensor, k: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor) -> None:
    """The operands of one launch share a dtype, a head dim and (the tail of the transposed
    codes is shared out per document) a document count."""
    if k.dtype != q.dtype or k.shape[2] != q.shape[2] or cu_seqlens_k.numel() != cu_seqlens_q.numel():
        raise ValueError(f"k: expected q's dtype {q.dtype}, head dim {q.shape[2]} and document count, got "
                         f"{k.dtype}, {k.shape[2]}, {cu_seqlens_k.numel() - 1} against {cu_seqlens_q.numel() - 1}")


def _launch_pair(sides: list[_Side], block: int, hadamard: bool, fmt: OperandFormat, scores: int = 0,
                 fp4: bool = False, transposed: bool = True) -> None:
    """Q's and K's sides (``_launch_operands``) in one launch, or one each where a side has no
    tokens (a launch's operands each hold tokens)."""
    with_tokens = [side for side in sides if side.x.shape[0]]
    for group in ([with_tokens] if len(with_tokens) == 2 else [[side] for side in with_tokens]):
        _launch_operands(group, block, hadamard, transposed, fmt, scores, fp4=fp4)


def _group_warps(tokens: int, d: int) -> int:
    """The warps of a launch of fp4_quantizer_gluon.py over units of ``tokens`` tokens at head
    dim d: a thread per 16-element group (at most 16 warps)."""
    return max(1, min(16, tokens * d // (16 * 32)))


def quantize_grad_output(do: torch.Tensor, o: torch.Tensor, ro: torch.Tensor, cu_seqlens: torch.Tensor,
                         block: int = 32, step: int = 64, cu_seqlens_t: torch.Tensor | None = None,
                         work: torch.Tensor | None = None, q_exps: torch.Tensor | None = None,
                         pv: torch.Tensor | None = None, m: torch.Tensor | None = None,
                         sigma: int = 0, fmt: OperandFormat = E4M3, fp4: bool = False,
                         transposed: bool = True, own_codes: bool = False, dot_values: bool = False) -> KernelGradOutput:
    """dO -> dO^, dOt^ and D in one launch that reads dO, O and ro once. do, o: [T, H, D]
    bf16/fp16/fp32, contiguous; ro: [H, T] fp32 (0 for invalid rows); cu_seqlens: int32
    [num_docs + 1] on do's device; block: dO^'s tokens per scale block; step: the dK/dV loop's query step
    (``bwd_block_m``), the extent of one dOt^ exponent; a multiple of ``block`` and of 16;
    cu_seqlens_t: ``aligned_starts(cu_seqlens)`` if the caller has it (Q's), else computed here;
    work: the launch's ``tile_list`` (units of ``step`` tokens, every document with a unit 0)
    if the caller has it, else built here. q_exps [T, H] int8, pv [T, Hkv] int32, m [H, T]
    fp32 and sigma: also write the backward's query records (``records.query_records``,
    ``KernelGradOutput.records``), saving their own launch; q_exps None with the BF16 format:
    Q's codes carry no exponents (eQ = 0). fmt: the codes' format (BF16:
    dO^ = bf16(dO), dOt^ = bf16(dO ro), exponents 0). fp4: the all-4-bit route's values
    (fmt BF16, ``quantize_fp4.quantize_fp4_grad_output``). transposed: also write dOt^ (else
    ``dot_codes_t`` is None; its exponents are written either way). own_codes: do is bf16 and
    fmt BF16, so dO^ = bf16(dO) is do's own bits: ``do_codes`` is do itself, not written.
    dot_values (fmt E4M3, transposed): dOt^ as bfloat16 values, each code times its step's
    2^edOt (exact), for a dV product in BF16 (``configs.Route.dot_values``)."""
    _check_rows(do, "do")
    _check_rows(o, "o")
    if o.shape != do.shape:
        raise ValueError(f"o: expected the shape of do {tuple(do.shape)}, got {tuple(o.shape)}")
    total, heads, d = do.shape
    if ro.shape != (heads, total) or ro.dtype != torch.float32:
        raise ValueError(f"ro: expected fp32 [{heads}, {total}], got {ro.dtype} {tuple(ro.shape)}")
    if step < T_ALIGN or step & (step - 1):
        # A unit of step tokens must cover its document's zero-padded transposed columns.
        raise ValueError(f"step: must be a power of two >= {T_ALIGN}, got {step}")
    _check_divisor(block, step, "block")
    if fp4 and (fmt != BF16 or not transposed):
        raise ValueError(f"fp4: the all-4-bit route writes bf16 values and dOt^, got the {fmt.name} format and "
                         f"transposed={transposed}")
    if dot_values and (fmt != E4M3 or not transposed):
        raise ValueError(f"dot_values: BF16 values of E4M3 dOt^ codes need the E4M3 format and transposed=True, got "
                         f"the {fmt.name} format and transposed={transposed}")
    if own_codes and (fmt != BF16 or fp4 or do.dtype != torch.bfloat16):
        raise ValueError(f"own_codes: needs bf16 do and the BF16 format without fp4, got do {do.dtype}, the "
                         f"{fmt.name} format and fp4={fp4}")
    dev = do.device
    do_codes = do if own_codes else torch.empty((total, heads, d), dtype=fmt.torch_dtype, device=dev)
    do_exps = torch.empty((total, heads), dtype=torch.int8, device=dev)
    cu_t = aligned_starts(cu_seqlens) if cu_seqlens_t is None else cu_seqlens_t
    dot_codes_t = _transposed_codes(heads, d, total, cu_seqlens, BF16 if dot_values else fmt) if transposed else None
    dot_exps = torch.empty((total, heads), dtype=torch.int8, device=dev)
    delta = torch.empty((heads, total), dtype=torch.float32, device=dev)
    records, heads_kv = None, 1
    if m is not None:
        heads_kv = pv.shape[1] if pv is not None and pv.dim() == 2 else 0
        if heads_kv == 0 or heads % heads_kv:
            raise ValueError(f"pv: expected [{total}, Hkv] with {heads} a multiple of Hkv, got "
                             f"{None if pv is None else tuple(pv.shape)}")
        if q_exps is None and fmt != BF16:
            raise ValueError(f"q_exps: the records of {fmt.name} codes need Q's exponents, got None")
        check_sigma(sigma)
        for name, x, dtype, shape in (("q_exps", q_exps, torch.int8, (total, heads)),
                                      ("pv", pv, torch.int32, (total, heads_kv)),
                                      ("m", m, torch.float32, (heads, total))):
            if x is not None or name != "q_exps":
                check_operand(name, x, dtype, shape)
        records = torch.empty((heads, total, 4), dtype=torch.int32, device=dev)
    if total:
        grid, args = _units(cu_seqlens, total, step, heads, work)
        common = dict(T=total, T_t=transposed_extent(total, cu_seqlens.numel() - 1), H=heads, p_qe=q_exps, p_pv=pv,
                      p_m=m, p_rec=records, heads_kv=heads_kv, D=d, STEP=step, RECORDS=records is not None,
                      GROUP=heads // heads_kv if records is not None else 1, SIGMA=sigma, T_ALIGN=T_ALIGN, **args)
        outputs = (do, o, ro.contiguous(), do_codes, do_exps, dot_codes_t, dot_exps, delta, cu_seqlens, cu_t)
        if fp4 and d <= 512 and not interpreting():  # its layouts hold 16 of a row's elements per lane
            # a thread per 16-element group, so the groups' maxima need no shuffles (fp4_quantizer_gluon.py)
            launch(fp4_grad_output_kernel, grid, *outputs, **common, num_warps=_group_warps(step, d))
        else:
            launch(_quantize_grad_output_kernel, grid, *outputs, **common, BLOCK=block, FP4=fp4,
                   TRANSPOSED=transposed, ROW_CODES=not own_codes, CODES=fmt.codes, DOT_VALUES=dot_values,
                   INTERPRET=interpreting(), num_warps=4)
    return KernelGradOutput(do_codes, do_exps, dot_codes_t, dot_exps, delta, cu_t, records)
