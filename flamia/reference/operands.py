"""Reference (torch) quantizers for the MXFP8 route's operands, in the kernels' order of
operations: the Triton quantizer (``flamia/kernels/quantize.py``) must match these bit for bit.
"""
from dataclasses import dataclass

import torch

from ..formats.e4m3 import E4M3_MAX, round_to_e4m3
from ..formats.hadamard import hadamard_transform
from ..formats.scales import exp2i, scale_exponent
from ..formats.token_block import quantize_padded
from ..varlen import make_packing, pad, unpad


@dataclass(frozen=True)
class Operand:
    """A token-block E4M3 operand. codes: [T, H, D] fp32 values on the E4M3 grid;
    exps: [T, H] int32; dequantized value = codes * 2^exps."""

    codes: torch.Tensor
    exps: torch.Tensor

    @property
    def factor(self) -> torch.Tensor:
        """The per-(token, head) fp32 scale, [T, H]."""
        return exp2i(self.exps)

    def dequantize(self) -> torch.Tensor:
        """codes * 2^exps, [T, H, D] fp32."""
        return self.codes * self.factor[..., None]


def quantize_operand(x: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int, block: int,
                     hadamard: bool = False) -> Operand:
    """Q, K, V (or dO) -> token-block E4M3. x: [T, H, D] any float dtype; the Hadamard
    rotation (fp32) comes before the block statistics."""
    xf = hadamard_transform(x) if hadamard else x.float()
    packing = make_packing(cu_seqlens, max_seqlen, multiple=block)
    codes, e = quantize_padded(pad(xf, packing), packing.valid, block)
    total = x.shape[0]
    return Operand(unpad(codes, packing, total), unpad(e, packing, total))


def bf16_operand(x: torch.Tensor, exps: torch.Tensor, hadamard: bool = False) -> Operand:
    """x [T, H, D] (rotated first with ``hadamard``) as BF16 codes on the given exponents
    [T, H] int32: codes = bf16(x * 2^-exps), exact scaling by a power of two."""
    xf = hadamard_transform(x) if hadamard else x.float()
    return Operand((xf * exp2i(-exps)[..., None]).to(torch.bfloat16).float(), exps)


def quantize_per_tensor(x: torch.Tensor, hadamard: bool = False) -> Operand:
    """One exponent for the whole tensor (the leaking baseline of paper Table 5)."""
    xf = hadamard_transform(x) if hadamard else x.float()
    e = scale_exponent(xf.abs().amax(), E4M3_MAX)
    codes = round_to_e4m3(xf * exp2i(-e))
    return Operand(codes, e.expand(x.shape[:2]).clone())


def row_delta(do_values: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
    """D(i) = sum_d dO(i, d) * O(i, d): [T, H, D] x2 -> [H, T] fp32."""
    return (do_values * o.float()).sum(-1).transpose(0, 1).contiguous()


@dataclass(frozen=True)
class GradOutput:
    """What the dO quantizer launch produces (NUMERICS.md 4).
    do: dO^ token blocks (for dP and D); dot: the second representation
    e4m3((dO * ro) * 2^-edOt) with one exponent per (query step, head), repeated per token;
    delta: [H, T] fp32, D(i) = sum_d dequant(dO^)(i, d) * O(i, d)."""

    do: Operand
    dot: Operand
    delta: torch.Tensor


def quantize_grad_output(do: torch.Tensor, o: torch.Tensor, ro: torch.Tensor, cu_seqlens: torch.Tensor,
                         max_seqlen: int, block: int, step: int) -> GradOutput:
    """do, o: [T, H, D]; ro: [H, T] fp32 (2^(PV - sigma) / l, 0 for invalid rows);
    ``step``: the dK/dV loop's query step (``bwd_block_m``)."""
    total = do.shape[0]
    do_op = quantize_operand(do, cu_seqlens, max_seqlen, block)
    delta = row_delta(do_op.dequantize(), o)
    w = do.float() * ro.transpose(0, 1)[..., None]
    packing = make_packing(cu_seqlens, max_seqlen, multiple=step)
    wp = pad(w, packing)
    b, length, h, _ = wp.shape
    amax = wp.abs().amax(-1).reshape(b, length // step, step, h).amax(2).repeat_interleave(step, dim=1)
    e = scale_exponent(amax, E4M3_MAX)
    codes = round_to_e4m3(wp * exp2i(-e)[..., None])
    dot = Operand(unpad(codes, packing, total), unpad(e, packing, total))
    return GradOutput(do_op, dot, delta)
