"""The fused NVFP4 quantizer of the 4-bit routes' head-dim operands (Q and K in the scores;
NUMERICS.md 1 and 6): one launch per tensor reads x once and writes the E2M1 codes, two per
byte, their E4M3 scales (one per 16 consecutive head-dim elements) and the per-token
exponent e of the power-of-two scale g = 2^(e - 2).

Order of operations, fp32, one IEEE rounding per step (``flamia.formats.nvfp4``):
- ``e = scale_exponent(amax, 448)`` from the row's max |x| (-100 for an all-zero row);
- ``s = e4m3_round_up(amax16 / (6 * g))``, one E4M3 step up where ``amax16 / (s * g) > 6``;
- ``codes = e2m1(x / (s * g))``, 0 in a group whose ``s * g`` is 0.
Divisions are ``div_rn`` (Triton's ``/`` is approximate in fp32 on the GPU). Every inexact
product feeds a division, never an add, so fma contraction cannot change a bit.

Programs map to ((document, unit), head) through the grid (W, H) and a
``worklist.tile_list`` of W entries, as ``quantize.py``'s: a unit is UNIT consecutive tokens
of one document, rows past its end load as zeros. NVFP4 itself is per token; the document
units are there for the token-axis E2M1 representations (16 tokens of one document per
scale) that the all-4-bit route's launches will add, reading x once. Nothing is read back to
the host. ``cu_seqlens[-1]`` must equal T (rows outside every document are not written).

A row holding a NaN or an Inf gets NaN scales (its codes and exponent are then meaningless),
so the non-finite value reaches every product that uses the token and no other token: the
torch reference refuses such rows instead. The torch reference these match bit for bit is
``flamia/formats/nvfp4.py``'s ``quantize_nvfp4`` (``reference/operands_fp4.nvfp4_operand``).
"""
import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..formats.hadamard import HADAMARD_DIMS
from ..formats.nvfp4 import NVFP4_GROUP
from .configs import QUANTIZER
from .fp4 import GROUP, e2m1_codes, nvfp4_groups, pack_e2m1
from .fp8 import E4M3_EQ, E4M3_MQ, interpreting, scale_exponent, to_e4m3, to_fp32
from .hadamard import rotate
from .launch import launch
from .quantize import _check_rows, _row_offsets, _unit_rows, _units
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


@triton.jit
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


def _check_args(x: torch.Tensor, cu_seqlens: torch.Tensor, hadamard: bool) -> None:
    _check_rows(x, "x")
    d = x.shape[-1]
    if hadamard and d not in HADAMARD_DIMS:
        raise ValueError(f"hadamard: head dim must be one of {HADAMARD_DIMS}, got {d}")
    if cu_seqlens.dtype != torch.int32 or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1:
        raise ValueError(f"cu_seqlens: expected int32 [num_docs + 1], got {cu_seqlens.dtype} "
                         f"{tuple(cu_seqlens.shape)}")
    if cu_seqlens.device != x.device:
        raise ValueError(f"cu_seqlens: must be on x's device {x.device}, got {cu_seqlens.device}")


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
