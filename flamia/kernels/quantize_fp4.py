"""The 4-bit routes' quantizer launches (NUMERICS.md 1 and 6).

``quantize_nvfp4_operand``: the fused NVFP4 quantizer of the head-dim operands (Q and K in the
scores): one launch per tensor reads x once and writes the E2M1 codes, two per byte, their
E4M3 scales (one per 16 consecutive head-dim elements) and the per-token exponent e of the
power-of-two scale g = 2^(e - 2).

The all-4-bit route (``fp4``): Hopper has no FP4 MMA, so its attention kernels multiply
decoded values in BF16, and its launches write every representation as bf16 holding the
dequantized value exactly (E2M1 value times all its scales: at most 6 significant bits), with
zero exponents: ``quantize_fp4_operand`` / ``quantize_fp4_pair`` (Q, K, V) and
``quantize_fp4_grad_output`` (dO) are ``quantize.py``'s launches with their FP4 switch on, so
work lists, the transposed layout (layout.py), the key and query records and D are theirs.
Each operand in one launch that reads it once: the NVFP4 codes (each token its own g), the
token-axis values (``codes_t``: one power-of-two scale per (16 tokens of one document,
column), ``reference.operands_fp4.token_axis_values``; a unit of 32 tokens from its document's
start holds whole groups) and, for K and V, the per-token values of the diagonal tiles
(``codes_t_diag``, ``per_token_values``). A non-finite value is never dropped: an NVFP4 row holding
a NaN or an Inf is NaN (the reference refuses it); in a token group or a token whose max |x|
is NaN the NaN stays and the rest are 0, as in the reference (the maxima keep NaN, as
torch's amax does), except that an Inf there becomes NaN where the NaN's mantissa exceeds
0x400000 (the GPU's computed NaNs: its scale 2^-127 is 0 in ``pow2``), where the reference
keeps inf. NaN payloads are not part of the contract.

Order of operations, fp32, one IEEE rounding per step (``flamia.formats.nvfp4``):
- ``e = scale_exponent(amax, 448)`` from the row's max |x| (-100 for an all-zero row);
- ``s = e4m3_round_up(amax16 / (6 * g))``, one E4M3 step up where ``amax16 / (s * g) > 6``;
- ``codes = e2m1(x / (s * g))``, 0 in a group whose ``s * g`` is 0.
Divisions are ``div_rn`` (Triton's ``/`` is approximate in fp32 on the GPU). Every inexact
product feeds a division, never an add, so fma contraction cannot change a bit.

Programs map to ((document, unit), head) through the grid (W, H) and a
``worklist.tile_list`` of W entries, as ``quantize.py``'s: a unit is UNIT consecutive tokens
of one document, rows past its end load as zeros. Nothing is read back to the host.
``cu_seqlens[-1]`` must equal T (rows outside every document are not written).

In ``quantize_nvfp4_operand`` a row holding a NaN or an Inf gets NaN scales (its codes and
exponent are then meaningless), so the non-finite value reaches every product that uses the
token and no other token: the torch reference refuses such rows instead. The torch
references these match bit for bit are ``flamia/formats/nvfp4.py``'s ``quantize_nvfp4`` and
``flamia/reference/operands_fp4.py``.
"""
import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..formats.hadamard import HADAMARD_DIMS
from ..formats.nvfp4 import NVFP4_GROUP
from .configs import BF16, QUANTIZER
from .fp4 import GROUP, e2m1_codes, nvfp4_groups, pack_e2m1
from .fp8 import E4M3_EQ, E4M3_MQ, interpreting, scale_exponent, to_e4m3, to_fp32
from .hadamard import rotate
from .launch import PACKING_INTS, launch
from .layout import check_operand
from .quantize import (KernelGradOutput, _check_pair, _check_rows, _launch_operands, _launch_pair, _row_offsets, _Side,
                       _unit_rows, _units, quantize_grad_output)
from .worklist import program_tile


class KernelNvfp4Operand(NamedTuple):
    """An NVFP4 operand as the 4-bit kernels read it.
    codes: uint8 [T, H, D / 2], E2M1 codes (bit 3 the sign), head-dim element 2i in the low
    nibble of byte i and 2i + 1 in the high one (``formats.e2m1.unpack_e2m1`` reads them);
    scales: float8_e4m3fn [T, H, D / 16], one per 16 consecutive head-dim elements;
    exps: int8 [T, H]. value = code x scale x 2^(exps - 2)."""

    codes: torch.Tensor
    scales: torch.Tensor
    exps: torch.Tensor


@dataclass(frozen=True)
class KernelFp4Operand:
    """An all-4-bit route operand as its kernels read it: decoded values in bf16, every scale
    folded in (exact), so every exponent is 0.
    codes: [T, H, D] bf16, NVFP4 along the head dim (each token its own g;
    ``reference.operands_fp4.nvfp4_operand(x, rotate).dequantize()``), for products over the
    head dim; codes_t: [H, D, T_t] bf16, E2M1 with one power-of-two scale per (16 tokens of one
    document, column) (``token_axis_values``), for products over tokens, in the layout of
    ``layout.py`` (tokens in order, zero outside documents); codes_t_diag: the same layout with one
    power-of-two scale per (token, head) (``per_token_values``), for the diagonal tiles, or
    None; exps: [T, H] int8 zeros; cu_seqlens_t: int32 [num_docs + 1], ``aligned_starts``;
    work: the launch's ``tile_list`` (None without tokens), which another launch over the same
    cu_seqlens can reuse; key_rec: [H, T] int32 ``records.key_records`` of zero exponents (every
    word ``records.UNIT_FACTORS``) when asked for (V's launch), else None. Rotated first (all of
    them) when the launch rotates."""

    codes: torch.Tensor
    codes_t: torch.Tensor
    codes_t_diag: torch.Tensor | None
    exps: torch.Tensor
    cu_seqlens_t: torch.Tensor
    work: torch.Tensor | None
    key_rec: torch.Tensor | None = None


@triton.jit(do_not_specialize=PACKING_INTS)
def _quantize_nvfp4_kernel(p_x, p_codes, p_scales, p_exps, cu_seqlens, p_work, width, H, inv_sqrt_d,
                           D: tl.constexpr, UNIT: tl.constexpr, HADAMARD_STAGES: tl.constexpr, INTERPRET: tl.constexpr):
    doc, unit = program_tile(p_work, width)
    if doc < 0:
        return
    h = tl.program_id(1).to(tl.int64)
    start, end, o_t, m_t = _unit_rows(cu_seqlens, doc, unit, UNIT)
    if start >= end:
        return
    # Rows past the document's end load as zeros: their stores are masked.
    b_x = to_fp32(tl.load(p_x + _row_offsets(o_t, h, H, D), mask=m_t[:, None], other=0.0), INTERPRET)  # [UNIT, D]
    b_x = rotate(b_x, inv_sqrt_d, HADAMARD_STAGES)
    b_e = scale_exponent(tl.max(tl.abs(b_x), axis=1), E4M3_EQ, E4M3_MQ)  # [UNIT] int32
    b_s, b_scaled = nvfp4_groups(b_x, b_e, D)  # [UNIT, D / 16], [UNIT, D]
    tl.store(p_codes + _row_offsets(o_t, h, H, D // 2), pack_e2m1(e2m1_codes(b_scaled)), mask=m_t[:, None])
    # the scales are E4M3 values already: the conversion is exact
    tl.store(p_scales + _row_offsets(o_t, h, H, D // GROUP), to_e4m3(b_s, INTERPRET), mask=m_t[:, None])
    tl.store(p_exps + o_t * H + h, b_e.to(tl.int8), mask=m_t)


def _check_args(x: torch.Tensor, cu_seqlens: torch.Tensor, hadamard: bool, name: str = "x",
                cu_seqlens_name: str = "cu_seqlens") -> None:
    _check_rows(x, name)
    d = x.shape[-1]
    if hadamard and d not in HADAMARD_DIMS:
        raise ValueError(f"hadamard: head dim must be one of {HADAMARD_DIMS}, got {d}")
    if cu_seqlens.dtype != torch.int32 or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1:
        raise ValueError(f"{cu_seqlens_name}: expected int32 [num_docs + 1], got {cu_seqlens.dtype} "
                         f"{tuple(cu_seqlens.shape)}")
    if cu_seqlens.device != x.device:
        raise ValueError(f"{cu_seqlens_name}: must be on {name}'s device {x.device}, got {cu_seqlens.device}")


def quantize_nvfp4_operand(x: torch.Tensor, cu_seqlens: torch.Tensor, hadamard: bool = False,
                           work: torch.Tensor | None = None) -> KernelNvfp4Operand:
    """Q or K -> NVFP4 along the head dim in one launch. x: [T, H, D] bf16/fp16/fp32,
    contiguous, D a power of two >= 16; cu_seqlens: int32 [num_docs + 1] on x's device,
    cu_seqlens[-1] = T; hadamard: rotate the head dim first (NUMERICS.md 2; D in
    ``HADAMARD_DIMS``); work: the ``KernelOperand.work`` of a ``quantize.quantize_operand``
    launch over the same cu_seqlens (same unit), else built here."""
    _check_args(x, cu_seqlens, hadamard)
    total, heads, d = x.shape
    dev = x.device
    codes = torch.empty((total, heads, d // 2), dtype=torch.uint8, device=dev)
    scales = torch.empty((total, heads, d // NVFP4_GROUP), dtype=torch.float8_e4m3fn, device=dev)
    exps = torch.empty((total, heads), dtype=torch.int8, device=dev)
    if total:
        unit = QUANTIZER.operand_unit
        grid, args = _units(cu_seqlens, total, unit, heads, work)
        launch(_quantize_nvfp4_kernel, grid, x, codes, scales, exps, cu_seqlens, args["p_work"], args["width"],
               H=heads, inv_sqrt_d=1.0 / math.sqrt(d), D=d, UNIT=unit,
               HADAMARD_STAGES=d.bit_length() - 1 if hadamard else 0, INTERPRET=interpreting(),
               num_warps=QUANTIZER.nvfp4_warps)
    return KernelNvfp4Operand(codes, scales, exps)


def _fp4_side(x: torch.Tensor, cu_seqlens: torch.Tensor, diagonal: bool, cu_seqlens_t: torch.Tensor | None,
              work: torch.Tensor | None, name: str) -> _Side:
    """An operand's outputs: bf16 codes, codes_t and (``diagonal``) codes_t_diag; cu_seqlens_t checked
    (``name``: the argument that holds it)."""
    if cu_seqlens_t is not None:
        check_operand(name, cu_seqlens_t, torch.int32, tuple(cu_seqlens.shape))
    return _Side.allocate(x, cu_seqlens, True, cu_seqlens_t, work, BF16, torch.bfloat16, diagonal)


def _fp4_operand(side: _Side, key_rec: torch.Tensor | None = None) -> KernelFp4Operand:
    return KernelFp4Operand(side.codes, side.codes_t, side.diag_t, side.exps, side.cu_seqlens_t, side.work, key_rec)


# bf16 codes take no exponents, so the launches' scale block changes nothing: one value for all
_NO_BLOCK = 1


def quantize_fp4_operand(x: torch.Tensor, cu_seqlens: torch.Tensor, hadamard: bool = False, diagonal: bool = False,
                         cu_seqlens_t: torch.Tensor | None = None, work: torch.Tensor | None = None,
                         key_records: bool = False) -> KernelFp4Operand:
    """Q, K or V -> the all-4-bit route's operand (``KernelFp4Operand``) in one launch that
    reads x once. x: [T, H, D] bf16/fp16/fp32, contiguous, D a power of two >= 16 (64, 128 or
    256 with ``hadamard``); cu_seqlens: int32 [num_docs + 1] on x's device, cu_seqlens[-1] = T;
    hadamard: rotate the head dim first (NUMERICS.md 2); diagonal: also write codes_t_diag (K, V);
    cu_seqlens_t: ``aligned_starts(cu_seqlens)`` if the caller has it, else computed here;
    work: the ``work`` of an earlier launch over the same cu_seqlens, else built here;
    key_records: also write key_rec (V's launch, saving the records' own launch)."""
    _check_args(x, cu_seqlens, hadamard)
    total, heads, _ = x.shape
    side = _fp4_side(x, cu_seqlens, diagonal, cu_seqlens_t, work, "cu_seqlens_t")
    key_rec = torch.empty((heads, total), dtype=torch.int32, device=x.device) if key_records else None
    if total:
        _launch_operands([side], _NO_BLOCK, hadamard, True, BF16, key_rec=key_rec, fp4=True)
    return _fp4_operand(side, key_rec)


def quantize_fp4_pair(q: torch.Tensor, k: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                      hadamard: bool = False, cu_seqlens_qt: torch.Tensor | None = None,
                      cu_seqlens_kt: torch.Tensor | None = None, q_work: torch.Tensor | None = None,
                      k_work: torch.Tensor | None = None) -> tuple[KernelFp4Operand, KernelFp4Operand]:
    """Q and K -> ``quantize_fp4_operand`` of each (Q without, K with codes_t_diag) in one launch
    (two when either has no tokens). q [Tq, Hq, D] and k [Tk, Hkv, D] share a dtype and a head
    dim; cu_seqlens_q and cu_seqlens_k a document count."""
    _check_args(q, cu_seqlens_q, hadamard, "q", "cu_seqlens_q")
    _check_args(k, cu_seqlens_k, hadamard, "k", "cu_seqlens_k")
    _check_pair(q, k, cu_seqlens_q, cu_seqlens_k)
    sides = [_fp4_side(q, cu_seqlens_q, False, cu_seqlens_qt, q_work, "cu_seqlens_qt"),
             _fp4_side(k, cu_seqlens_k, True, cu_seqlens_kt, k_work, "cu_seqlens_kt")]
    _launch_pair(sides, _NO_BLOCK, hadamard, BF16, fp4=True)
    return _fp4_operand(sides[0]), _fp4_operand(sides[1])


def quantize_fp4_grad_output(do: torch.Tensor, o: torch.Tensor, ro: torch.Tensor, cu_seqlens: torch.Tensor,
                             step: int = 64, cu_seqlens_t: torch.Tensor | None = None,
                             work: torch.Tensor | None = None, q_exps: torch.Tensor | None = None,
                             pv: torch.Tensor | None = None, m: torch.Tensor | None = None,
                             sigma: int = 0) -> KernelGradOutput:
    """dO -> the all-4-bit route's dO representations and D in one launch that reads dO, O and
    ro once (``quantize.quantize_grad_output``'s arguments and outputs; the torch reference is
    ``reference.operands_fp4.quantize_fp4_grad_output``): do_codes [T, H, D] bf16, NVFP4 dO
    decoded (each token its own g); dot_codes_t [H, D, T_t] bf16, ``token_axis_values`` of the
    fp32 product dO * ro in the layout of ``layout.py``; do_exps, dot_exps: [T, H] int8 zeros;
    delta [H, T] fp32 = sum_d do_codes * O; records: ``records.query_records`` of q_exps (the
    fp4 Q's: zeros), zero dO exponents, pv, m, ro, delta and sigma, when q_exps is given."""
    _check_args(do, cu_seqlens, False, "do")
    if cu_seqlens_t is not None:
        check_operand("cu_seqlens_t", cu_seqlens_t, torch.int32, tuple(cu_seqlens.shape))
    return quantize_grad_output(do, o, ro, cu_seqlens, _NO_BLOCK, step, cu_seqlens_t, work, q_exps, pv, m, sigma,
                                BF16, fp4=True)
