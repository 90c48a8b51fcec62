"""Reference quantizers of the 4-bit routes' operands (NUMERICS.md 6).

Two kinds, by contraction axis. Operands contracted over the head dim (Q, K in the scores;
dO, V in dP) are NVFP4: codes times E4M3 group scales multiply in the MMA, and the per-token
power-of-two scale ``g = 2^(e - 2)`` is a factor applied outside it, as the token-block
exponents are on the MXFP8 route: an ``Operand`` whose codes are the values times 2^-2
(exact in BF16) and whose exponents are e. Operands contracted over tokens (V in P.V, dOt in
dV, Q in dK, K in dQ) are E2M1 with one power-of-two scale per (16 tokens of one document,
column): such a scale varies along the head dim and cannot leave the MMA, so these operands
are kept as decoded values (exact in fp32) with factor 1. V in P.V and K in dQ also have a second representation with
one power-of-two scale per token, which the diagonal tiles use.
"""
from dataclasses import dataclass

import torch

from ..formats.hadamard import hadamard_transform
from ..formats.nvfp4 import NVFP4_G_SHIFT, quantize_nvfp4, round_e2m1_pow2
from ..varlen import make_packing, pad, unpad
from .operands import GradOutput, Operand, row_delta

TOKEN_GROUP = 16  # tokens of one document sharing a scale along a token-axis contraction


@dataclass(frozen=True)
class TokenAxisOperand:
    """codes: [T, H, D] fp32 decoded values (E2M1 code x power-of-two scale of its
    (16 tokens, column) group); diagonal: the same operand with one power-of-two scale per
    (token, head), [T, H, D], or None where no diagonal tile needs it."""

    codes: torch.Tensor
    diagonal: torch.Tensor | None = None

    @property
    def factor(self) -> torch.Tensor:
        """No per-token factor: [T, H] ones."""
        return torch.ones(self.codes.shape[:2], device=self.codes.device)

    @property
    def exps(self) -> torch.Tensor:
        """[T, H] int32 zeros: nothing to fold into P (so PV = 0)."""
        return torch.zeros(self.codes.shape[:2], dtype=torch.int32, device=self.codes.device)


def nvfp4_operand(x: torch.Tensor, rotate: bool = False, per_tensor: bool = False,
                  exps: "torch.Tensor | None" = None) -> Operand:
    """[T, H, D] -> NVFP4 along the head dim, after the Hadamard rotation when ``rotate``:
    codes [T, H, D] fp32 = E2M1 code x E4M3 scale x 2^-2, exps [T, H] int32 (g = 2^(exps - 2)).
    exps: the tokens' scale exponents (``quantize_nvfp4``); None: each token's own (the
    tensor's when ``per_tensor``)."""
    t = quantize_nvfp4(hadamard_transform(x) if rotate else x.float(), exps, per_tensor)
    return Operand(t.values() * 2.0 ** -NVFP4_G_SHIFT, t.exps)


def token_axis_values(x: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int) -> torch.Tensor:
    """[T, H, D] float -> [T, H, D] fp32 E2M1 values, one power-of-two scale per
    (16 tokens of one document, head, column); groups restart at every document start."""
    packing = make_packing(cu_seqlens, max_seqlen, multiple=TOKEN_GROUP)
    xp = pad(x.float(), packing)                                   # [B, L, H, D], padding 0
    groups = xp.unflatten(1, (-1, TOKEN_GROUP))                    # [B, L/16, 16, H, D]
    values = round_e2m1_pow2(groups, groups.abs().amax(2, keepdim=True))
    return unpad(values.flatten(1, 2), packing, x.shape[0])


def per_token_values(x: torch.Tensor) -> torch.Tensor:
    """[T, H, D] float -> fp32 E2M1 values with one power-of-two scale per (token, head)."""
    xf = x.float()
    return round_e2m1_pow2(xf, xf.abs().amax(-1, keepdim=True))


def token_axis_operand(x: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int, rotate: bool = False,
                       diagonal: bool = False) -> TokenAxisOperand:
    """[T, H, D] -> a token-axis operand (with its per-token diagonal form when ``diagonal``)."""
    xf = hadamard_transform(x) if rotate else x.float()
    return TokenAxisOperand(token_axis_values(xf, cu_seqlens, max_seqlen),
                            per_token_values(xf) if diagonal else None)


def quantize_fp4_grad_output(do: torch.Tensor, o: torch.Tensor, ro: torch.Tensor, cu_seqlens: torch.Tensor,
                             max_seqlen: int, per_tensor: bool = False) -> GradOutput:
    """The all-4-bit route's dO representations: NVFP4 dO for dP and D, and the token-axis
    ``dOt = dO * ro`` for dV. do, o: [T, H, D]; ro: [H, T] fp32."""
    do_op = nvfp4_operand(do, per_tensor=per_tensor)
    dot = token_axis_operand(do.float() * ro.transpose(0, 1)[..., None], cu_seqlens, max_seqlen)
    return GradOutput(do_op, dot, row_delta(do_op.dequantize(), o))
