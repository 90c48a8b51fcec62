"""Document-local token-block scaling (NUMERICS.md 2) of packed rows.

A block is ``block`` consecutive tokens of ONE document (blocks restart at every document
start; a document's last block may be short) times the full head dim of one head. Each block
has one power-of-two exponent e(b), chosen so the block maximum maps to <= 448, and codes
``X^ = e4m3(X * 2^-e(b))``. The exponents are stored densely, one per (token, head), so a
kernel indexes them by token without knowing where blocks begin. ``block=1`` gives per-token
scales (the exact options).
"""
import torch

from ..varlen import make_packing, pad, unpad
from .e4m3 import E4M3_MAX, round_to_e4m3
from .scales import exp2i, scale_exponent


def block_amax(x: torch.Tensor, valid: torch.Tensor, block: int) -> torch.Tensor:
    """Max |x| of each block in a padded layout. x: [B, L, H, D] with L % block == 0,
    valid: [B, L]. Returns [B, L, H] fp32, the block's max repeated over its tokens."""
    b, length, h, _ = x.shape
    a = torch.where(valid[..., None, None], x.float().abs(), torch.zeros((), device=x.device))
    a = a.amax(dim=-1).reshape(b, length // block, block, h).amax(dim=2)  # [B, L/blk, H]
    return a.repeat_interleave(block, dim=1)


def quantize_padded(x: torch.Tensor, valid: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-block E4M3 of a padded [B, L, H, D] tensor: (fp32 code values [B, L, H, D],
    int32 exponents [B, L, H]). Invalid rows get code 0."""
    e = scale_exponent(block_amax(x, valid, block), E4M3_MAX)
    codes = round_to_e4m3(x.float() * exp2i(-e)[..., None])
    return torch.where(valid[..., None, None], codes, torch.zeros((), device=x.device)), e


def quantize_token_blocks(x: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int, block: int = 32
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed [total, H, D] float -> (E4M3 codes [total, H, D] ``float8_e4m3fn``,
    int8 exponents [total, H]). Dequantized value: codes * 2^exponent."""
    packing = make_packing(cu_seqlens, max_seqlen, multiple=block)
    codes, e = quantize_padded(pad(x, packing), packing.valid, block)
    total = x.shape[0]
    return unpad(codes, packing, total).to(torch.float8_e4m3fn), unpad(e, packing, total).to(torch.int8)


def dequantize_token_blocks(codes: torch.Tensor, exps: torch.Tensor) -> torch.Tensor:
    """fp32 values of (codes [..., D], int8 exponents [...])."""
    return codes.float() * exp2i(exps.int())[..., None]
