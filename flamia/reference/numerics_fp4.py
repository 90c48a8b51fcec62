"""Numerics of the 4-bit recipes for the emulator (NUMERICS.md 6).

``nvfp4`` (mixed NVFP4/FP8): NVFP4 Q and K for the scores, in the forward and in the backward's
recomputation; P in E2M1 with one power-of-two scale per (row, 32 keys) except on diagonal
forward tiles, where it is E4M3 as on the MXFP8 route; everything else as MXFP8.
``fp4`` (all 4-bit): additionally V, dO, the gradient operands Q and K, and G in E2M1, and
4-bit P on every tile (see ``operands_fp4.py`` for the operand layouts).

Group maxima of P skip masked keys, so no P group straddles the causal boundary; the
``p4_scale_before_mask`` ablation takes them over every in-bounds key instead (the leak).
"""
import torch

from ..formats.e2m1 import E2M1_MAX, round_to_e2m1, round_to_e2m1_stochastic
from ..formats.nvfp4 import round_e2m1_pow2
from ..tiling import NumericsTiles
from .numerics import Bf16Scores, Numerics
from .operands_fp4 import TOKEN_GROUP, TokenAxisOperand, nvfp4_operand, quantize_fp4_grad_output, token_axis_operand

P_GROUP = 32  # keys (from the document start) sharing one power-of-two scale of 4-bit P


def _fold(y: torch.Tensor, vf: torch.Tensor, rf: torch.Tensor) -> torch.Tensor:
    """The V fold of NUMERICS.md 3, step 6: two exact power-of-two multiplies."""
    return (y * vf[:, :, None, :]) * rf[..., None]


class Nvfp4Numerics(Numerics):
    """Mixed NVFP4/FP8: NVFP4 scores, 4-bit P off the diagonal, E4M3 elsewhere.
    ``per_tensor_scales`` makes the NVFP4 ``g`` tensor-wide, and the E4M3 operands too."""

    def score_operands(self, q, k, cu_q, cu_k, max_q, max_k):
        """NVFP4 whose g shares the exponents of the E4M3 token blocks (``grad_operands``):
        the kernels apply one exponent per token to both representations."""
        return (nvfp4_operand(q, self.hadamard, exps=Numerics.operand(self, q, cu_q, max_q, self.hadamard).exps),
                nvfp4_operand(k, self.hadamard, exps=Numerics.operand(self, k, cu_k, max_k, self.hadamard).exps))

    def grad_operands(self, q, k, score_q, score_k, cu_q, cu_k, max_q, max_k):
        """E4M3 token blocks of Q and K (rotated as the scores' were)."""
        return self.operand(q, cu_q, max_q, self.hadamard), self.operand(k, cu_k, max_k, self.hadamard)

    def p4_everywhere(self) -> bool:
        """Whether diagonal tiles take 4-bit P too (nvfp4: only in the leaking ablation)."""
        return self.recipe.p4_scale_before_mask

    def p4_pairs(self, tile, forward) -> "torch.Tensor | None":
        """Where P is 4-bit: None on every pair, else a bool mask broadcastable to the tile
        (the diagonal tiles keep E4M3 P). The backward rebuilds the forward's choice from
        the forward's tile geometry; the fwd_diag_block_m ablation gives the forward other
        row tiles than the backward assumes."""
        if self.p4_everywhere():
            return None
        block_m = (self.recipe.fwd_diag_block_m or tile.tiles.fwd_block_m) if forward else tile.tiles.fwd_block_m
        return ~tile.diagonal(block_m, tile.tiles.diag_block_n)

    def p_values(self, p, x, m, vf, rf, tile, forward):
        if not forward and self.recipe.fwd_p4_bwd_p8:
            return super().p_values(p, x, m, vf, rf, tile, forward)
        p4 = self.p4_operand(_fold(self.quantize_p4(p, x, m, tile, forward), vf, rf))
        pairs = self.p4_pairs(tile, forward)
        return p4 if pairs is None else torch.where(pairs, p4, super().p_values(p, x, m, vf, rf, tile, forward))

    def p4_operand(self, y: torch.Tensor) -> torch.Tensor:
        """Folded 4-bit P as it multiplies V's E4M3 codes: an E4M3 operand of the FP8 MMA.
        Exact (E2M1 x 2^k has two significant bits) except below 2^-8, where E4M3's
        subnormal grid rounds it as it rounds E4M3 P."""
        return self.round_p(y)

    def row_mass(self, p, pq, x, m, vf, rf, tile):
        """With ``p4_sum_quantized``, the 4-bit values (before the exact V fold) on 4-bit
        pairs: O then divides by the sum of the weights it used."""
        if not self.recipe.p4_sum_quantized:
            return super().row_mass(p, pq, x, m, vf, rf, tile)
        p4 = self.quantize_p4(p, x, m, tile, forward=True)
        pairs = self.p4_pairs(tile, forward=True)
        return (p4 if pairs is None else torch.where(pairs, p4, p)).sum(-1)

    def quantize_p4(self, p, x, m, tile, forward) -> torch.Tensor:
        """4-bit P before the V fold, [B, H, Lq, N]: ``e2m1(p * 2^-eg) * 2^eg`` with
        ``eg = scale_exponent(exp2(gmax - m), 6)`` per (row, 32 keys), gmax the group's max
        score over its visible keys (over its in-bounds keys when ``p4_scale_before_mask``)."""
        if tile.k0 % P_GROUP or (tile.k1 - tile.k0) % P_GROUP:
            raise AssertionError(f"key tile [{tile.k0}, {tile.k1}) is not made of {P_GROUP}-key groups")
        groups = p.unflatten(-1, (-1, P_GROUP))                     # [B, H, Lq, N/32, 32]
        if self.recipe.p4_scale_before_mask:
            xg = x.masked_fill(~tile.in_bounds(), float("-inf")).unflatten(-1, (-1, P_GROUP)).amax(-1)
            m_fin = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
            gmax = self.exp2(xg - m_fin[..., None], forward)
        else:
            gmax = groups.amax(-1)  # p is 0 on masked keys: this is exp2(visible gmax - m)
        return round_e2m1_pow2(groups, gmax[..., None]).flatten(-2)


class Nvfp4Bf16ScoresNumerics(Bf16Scores, Nvfp4Numerics):
    """The mixed route with BF16 scores (``Recipe.bf16_scores``): 4-bit P as nvfp4's, S from
    BF16 codes of Q and K instead of their NVFP4 values."""


class Fp4Numerics(Nvfp4Numerics):
    """All 4-bit: E2M1 operands (NVFP4 over the head dim, power-of-two groups of 16 tokens
    over tokens, per key on diagonal tiles), 4-bit P on every tile, E2M1 G. No operand has
    token blocks, so ``scale_block`` changes nothing; ``per_tensor_scales`` makes the NVFP4
    ``g`` tensor-wide."""

    qmax = E2M1_MAX  # of G's scale groups

    def score_operands(self, q, k, cu_q, cu_k, max_q, max_k):
        """NVFP4 with each token's own g (no token-block operand to share it with)."""
        per_tensor = self.recipe.per_tensor_scales
        return nvfp4_operand(q, self.hadamard, per_tensor), nvfp4_operand(k, self.hadamard, per_tensor)

    def operand(self, x, cu_seqlens, max_seqlen, rotate):
        """V in P.V: contracted over keys, with its per-key form for the diagonal tiles."""
        return token_axis_operand(x, cu_seqlens, max_seqlen, rotate, diagonal=True)

    def grad_operands(self, q, k, score_q, score_k, cu_q, cu_k, max_q, max_k):
        """Q in dK (over queries) and K in dQ (over keys, per key on diagonal tiles)."""
        return (token_axis_operand(q, cu_q, max_q, self.hadamard),
                token_axis_operand(k, cu_k, max_k, self.hadamard, diagonal=True))

    def value_grad_operand(self, v, v_op, cu_k, max_k):
        return nvfp4_operand(v, per_tensor=self.recipe.per_tensor_scales)

    def diagonal_codes(self, op):
        return op.diagonal if isinstance(op, TokenAxisOperand) else None

    def grad_output(self, do, o, ro, cu_q, max_q, step):
        return quantize_fp4_grad_output(do, o, ro, cu_q, max_q, self.recipe.per_tensor_scales)

    def p4_everywhere(self) -> bool:
        return True

    def p4_operand(self, y):
        """V is E2M1 values here (no E4M3 operand): the folded 4-bit P multiplies as it is."""
        return y

    def round_grad(self, y, words=None):
        return round_to_e2m1(y) if words is None else round_to_e2m1_stochastic(y, words)

    def grad_groups(self, tiles: NumericsTiles) -> tuple[int, int]:
        """G in both products: 16 tokens of one document per scale, as the other operands."""
        return TOKEN_GROUP, TOKEN_GROUP
