"""Per-recipe numerics for the emulator: how operands are quantized and how P, dO and G are
rounded. The tile loop in ``emulated.py`` is shared by every recipe and picks one ``Numerics``
class per recipe name (``emulated.numerics_for``). MXFP8 (token-block E4M3) and BF16 live
here; the 4-bit recipes extend ``Numerics`` in ``numerics_fp4.py``.
"""
import torch

from ..formats.bitexp import schraudolph_exp2
from ..formats.e4m3 import E4M3_MAX, round_to_e4m3
from ..formats.scales import scale_exponent
from ..recipes import Recipe
from ..tiling import NumericsTiles
from .operands import (GradOutput, Operand, bf16_operand, quantize_grad_output, quantize_operand, quantize_per_tensor,
                       row_delta)


class Numerics:
    """MXFP8: token-block E4M3 operands, E4M3 P with the V fold, E4M3 G with per-row (dQ) and
    per-key (dK) power-of-two scales (NUMERICS.md 3-4)."""

    qmax = E4M3_MAX
    # dV's operands: P^ against dOt^ = dO ro (NUMERICS.md 4); True: P^ ro rounded as P is,
    # against dO^ (the bf16 recipe, 4a)
    ro_in_p = False

    def __init__(self, recipe: Recipe, head_dim: int):
        self.recipe = recipe
        self.hadamard = recipe.use_hadamard(head_dim)

    # -- operands -------------------------------------------------------------------------
    def operand(self, x: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int, rotate: bool) -> Operand:
        """Q, K or V: [T, H, D] -> token-block (or per-tensor) E4M3."""
        if self.recipe.per_tensor_scales:
            return quantize_per_tensor(x, rotate)
        return quantize_operand(x, cu_seqlens, max_seqlen, self.recipe.scale_block, rotate)

    def score_operands(self, q, k, cu_q, cu_k, max_q, max_k) -> tuple[Operand, Operand]:
        """The representations of Q and K used for the scores (forward and recomputation)."""
        return (self.operand(q, cu_q, max_q, self.hadamard), self.operand(k, cu_k, max_k, self.hadamard))

    def grad_operands(self, q, k, score_q: Operand, score_k: Operand, cu_q, cu_k, max_q, max_k
                      ) -> tuple[Operand, Operand]:
        """The representations of Q and K in dK = G^T Q and dQ = G K (MXFP8: the same codes)."""
        return score_q, score_k

    def value_grad_operand(self, v, v_op: Operand, cu_k, max_k) -> Operand:
        """The representation of V in dP = dO V^T (MXFP8: the one P.V used)."""
        return v_op

    def diagonal_codes(self, op) -> torch.Tensor | None:
        """Codes [T, H, D] that replace ``op``'s on diagonal tiles, where a 4-bit operand
        contracted over keys (V in P.V, K in dQ) takes per-key scales; None: no replacement."""
        return None

    def grad_output(self, do, o, ro, cu_q, max_q, step) -> GradOutput:
        """dO's two representations and D (NUMERICS.md 4): do, o [Tq, H, D]; ro [H, Tq] fp32;
        step: the dK/dV loop's query step (``bwd_block_m``), the extent of dOt's exponent."""
        g = quantize_grad_output(do, o, ro, cu_q, max_q, self.recipe.scale_block, step)
        if not self.recipe.per_tensor_scales:
            return g
        do_op = quantize_per_tensor(do)
        return GradOutput(do_op, g.dot, row_delta(do_op.dequantize(), o))

    # -- rounding ---------------------------------------------------------------------------
    def exp2(self, x: torch.Tensor, forward: bool) -> torch.Tensor:
        """2^x, fp32 [B, H, Lq, N]; the forward's may be approximate (``fwd_approx_exp``)."""
        if forward and self.recipe.fwd_approx_exp:
            return schraudolph_exp2(x)
        return torch.exp2(x)

    def row_mass(self, p, pq, x, m, vf, rf, tile) -> torch.Tensor:
        """What a key tile adds to the forward's row sum l [B, H, Lq] (NUMERICS.md 3, step 5):
        the values of the P codes pq [B, H, Lq, N] that P.V uses, without the V fold
        (``Recipe.sums_codes``, 3b), else rowsum(p), the fp32 probabilities before the fold.
        vf [B, H, N], rf [B, H, Lq]: the fold's factors; x, m, tile: as ``p_values`` takes them."""
        if self.recipe.sums_codes:
            return (pq * (1.0 / vf[:, :, None, :])).sum(-1) * (1.0 / rf)
        return p.sum(-1)

    def p_values(self, p, x, m, vf, rf, tile, forward: bool) -> torch.Tensor:
        """P as it multiplies V's codes: round((p * vf) * rf). p: [B, H, Lq, N]; x: the scores
        [B, H, Lq, N] before the visibility mask; m, rf: [B, H, Lq]; vf: [B, H, N]; tile: the
        key tile (for recipes whose P depends on it)."""
        return self.round_p((p * vf[:, :, None, :]) * rf[..., None])

    def round_p(self, y: torch.Tensor) -> torch.Tensor:
        """E4M3 probabilities; saturating only when the tau + sigma check was switched off,
        as the hardware's satfinite convert would."""
        return round_to_e4m3(y, saturate=not self.recipe.check_saturation)

    def round_grad(self, y: torch.Tensor, words: "torch.Tensor | None" = None) -> torch.Tensor:
        """G (already scaled into range) -> its E4M3 values. words: the random words of a route
        that rounds G stochastically (``Recipe.rounds_grad_stochastically``), else None."""
        return round_to_e4m3(y)

    def grad_exponent(self, amax: torch.Tensor) -> torch.Tensor:
        """Power-of-two exponent of a G scale group from its max |G|."""
        return scale_exponent(amax, self.qmax)

    def grad_groups(self, tiles: NumericsTiles) -> tuple[int, int]:
        """Extents of G's scale groups: (queries per dK-payload group, keys per dQ-payload
        group); MXFP8: the dK/dV loop's query step and the dQ loop's key step."""
        return tiles.bwd_block_m, tiles.dq_block_n


class Bf16Scores:
    """``Recipe.bf16_scores`` for a route whose Q and K are E4M3 token blocks (mxfp8, nvfp4):
    Q and K in S as BF16 codes on those blocks' exponents, the blocks themselves in dK = G^T Q
    and dQ = G K (NUMERICS.md 3a). A mixin, before the route's ``Numerics`` class."""

    def score_operands(self, q, k, cu_q, cu_k, max_q, max_k):
        return tuple(bf16_operand(x, self.operand(x, cu, n, self.hadamard).exps, self.hadamard)
                     for x, cu, n in ((q, cu_q, max_q), (k, cu_k, max_k)))

    def grad_operands(self, q, k, score_q, score_k, cu_q, cu_k, max_q, max_k):
        return self.operand(q, cu_q, max_q, self.hadamard), self.operand(k, cu_k, max_k, self.hadamard)


class Bf16ScoresNumerics(Bf16Scores, Numerics):
    """MXFP8 with BF16 scores: E4M3 everywhere but S."""


class Bf16Numerics(Numerics):
    """FlashAttention in BF16: operands, P, dO and dS rounded to BF16; no scales; dV from P^ ro
    rounded to BF16, FlashAttention's normalized P."""

    ro_in_p = True

    def operand(self, x, cu_seqlens, max_seqlen, rotate):
        xf = x.to(torch.bfloat16).float()
        return Operand(xf, torch.zeros(x.shape[:2], dtype=torch.int32, device=x.device))

    def grad_output(self, do, o, ro, cu_q, max_q, step):
        do_op = self.operand(do, cu_q, max_q, False)
        dot = self.operand(do.float() * ro.transpose(0, 1)[..., None], cu_q, max_q, False)
        return GradOutput(do_op, dot, row_delta(do_op.codes, o))

    def round_p(self, y):
        return y.to(torch.bfloat16).float()

    def round_grad(self, y, words=None):
        return y.to(torch.bfloat16).float()

    def grad_exponent(self, amax):
        return torch.zeros(amax.shape, dtype=torch.int32, device=amax.device)
