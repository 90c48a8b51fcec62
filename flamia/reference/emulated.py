"""Tile-faithful emulation of every recipe, forward and backward (NUMERICS.md 3-6).

The oracle for the Triton kernels and the attention of the training experiment's 4-bit and
deliberately broken runs. It follows NUMERICS.md's order of operations step by step, so the
kernels' quantized codes and integer row maxima compare exactly and their outputs differ only
by fp32 summation order. Vectorized over documents, heads and query rows in the padded
layout of ``layout.py``; Python loops run over key tiles only, so it also runs on a GPU.
"""
import math
from dataclasses import dataclass, field

import torch

from ..formats.hadamard import hadamard_transform
from ..formats.random_bits import grad_bits
from ..formats.scales import exp2i
from ..recipes import Recipe, resolve_recipe
from ..scaling import prefix_v_exponent
from ..spec import AttnSpec
from ..tiling import NumericsTiles, numerics_tiles
from .layout import DocLayout, make_layout, tile_multiple
from .numerics import Bf16Numerics, Bf16ScoresNumerics, Numerics
from .numerics_fp4 import Fp4Numerics, Nvfp4Bf16ScoresNumerics, Nvfp4Numerics
from .operands import Operand

LOG2E = math.log2(math.e)
LN2 = math.log(2.0)
NUMERICS = {"mxfp8": Numerics, "bf16": Bf16Numerics, "nvfp4": Nvfp4Numerics, "fp4": Fp4Numerics}
BF16_SCORES_NUMERICS = {"mxfp8": Bf16ScoresNumerics, "nvfp4": Nvfp4Bf16ScoresNumerics}


def numerics_for(recipe: Recipe, head_dim: int) -> Numerics:
    """The rounding hooks of ``recipe`` at ``head_dim``: one Numerics class per recipe name
    (with ``bf16_scores``: its own)."""
    if recipe.bf16_scores:
        return BF16_SCORES_NUMERICS[recipe.name](recipe, head_dim)
    return NUMERICS[recipe.name](recipe, head_dim)


@dataclass(frozen=True)
class KeyTile:
    """The key range [k0, k1) being processed and its visibility mask [B, 1, Lq, k1 - k0]."""

    k0: int
    k1: int
    visible: torch.Tensor
    layout: DocLayout
    tiles: NumericsTiles

    def in_bounds(self) -> torch.Tensor:
        """[B, 1, Lq, k1 - k0] bool: pairs of a real query and a real key (visible or masked)."""
        return _in_bounds(self.layout, self.layout.lq, self.k0, self.k1)

    def diagonal(self, block_m: int, block_n: int) -> torch.Tensor:
        """[B, 1, Lq, k1 - k0] bool: whether each pair lies in a diagonal tile of block_m
        queries x block_n keys (tiles start at the document start): one holding both visible
        and masked in-bounds pairs, where the causal or window boundary runs through."""
        lay = self.layout
        q1 = -(-lay.lq // block_m) * block_m
        a0, a1 = self.k0 // block_n * block_n, -(-self.k1 // block_n) * block_n
        vis = lay.visible(0, q1, a0, a1)                                   # [B, 1, q1, a1 - a0]
        masked = _in_bounds(lay, q1, a0, a1) & ~vis
        blocks = (vis.shape[0], 1, q1 // block_m, block_m, (a1 - a0) // block_n, block_n)
        diag = vis.reshape(blocks).any(5).any(3) & masked.reshape(blocks).any(5).any(3)
        diag = diag.repeat_interleave(block_m, 2).repeat_interleave(block_n, 3)
        return diag[:, :, :lay.lq, self.k0 - a0:self.k1 - a0]


def _in_bounds(lay: DocLayout, q1: int, k0: int, k1: int) -> torch.Tensor:
    """[B, 1, q1, k1 - k0] bool: query < Lq and key < Lk of the document."""
    dev = lay.len_q.device
    qp = torch.arange(q1, device=dev)[:, None]
    kp = torch.arange(k0, k1, device=dev)[None, :]
    return (qp < lay.len_q) & (kp < lay.len_k)


@dataclass
class EmulatedForward:
    """Forward results (packed: out [Tq, Hq, D]; lse, m, ro [Hq, Tq] fp32) and what the
    backward needs. ``p_trace`` (when recorded): per key tile (k0, P values, running m)."""

    out: torch.Tensor
    lse: torch.Tensor
    m: torch.Tensor
    ro: torch.Tensor
    q_op: Operand
    k_op: Operand
    v_op: Operand
    pv: torch.Tensor
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    spec: AttnSpec
    tiles: NumericsTiles
    numerics: Numerics
    layout: DocLayout
    p_trace: list = field(default_factory=list)


@dataclass(frozen=True)
class _Rows:
    """Padded per-row operands [B, H, L, D] and factors [B, H, L] shared by both passes."""

    qc: torch.Tensor
    qs: torch.Tensor  # softmax_scale * log2(e) * query factor (one fp32 rounding)
    kc: torch.Tensor
    kf: torch.Tensor
    vc: torch.Tensor
    vf: torch.Tensor
    pv: torch.Tensor  # PV per query row (int)
    rf: torch.Tensor  # 2^(sigma - PV)


def _rows(lay: DocLayout, q_op, k_op, v_op, pv, spec: AttnSpec) -> _Rows:
    """The padded rows of both passes from the packed operands and PV [Tq, Hkv] int."""
    s2 = torch.tensor(spec.softmax_scale * LOG2E, dtype=torch.float32)
    pv_q = lay.rows_q(pv.repeat_interleave(lay.group, dim=1))
    return _Rows(qc=lay.rows_q(q_op.codes), qs=lay.rows_q(q_op.factor, fill=1.0) * s2,
                 kc=lay.rows_k(k_op.codes), kf=lay.rows_k(k_op.factor, fill=1.0),
                 vc=lay.rows_k(v_op.codes), vf=lay.rows_k(v_op.factor, fill=1.0),
                 pv=pv_q, rf=exp2i(spec.recipe.sigma - pv_q))


def _scores(r: _Rows, tile: KeyTile) -> tuple[torch.Tensor, torch.Tensor]:
    """x = (S * qs) * kf with S = Q^ K^T over the tile's keys, [B, H, Lq, N] fp32
    (NUMERICS.md 3, step 1): (x, x with -inf where not visible)."""
    k0, k1 = tile.k0, tile.k1
    s = r.qc @ r.kc[:, :, k0:k1].transpose(-1, -2)
    x = (s * r.qs[..., None]) * r.kf[:, :, None, k0:k1]
    return x, x.masked_fill(~tile.visible, float("-inf"))


def _key_tiles(lay: DocLayout, width: int, tiles: NumericsTiles):
    """The key tiles [k0, k0 + width) of the padded layout, in ascending order."""
    for k0 in range(0, lay.lk, width):
        yield KeyTile(k0, k0 + width, lay.visible(0, lay.lq, k0, k0 + width), lay, tiles)


def _diagonal_rows(lay: DocLayout, num: Numerics, op) -> torch.Tensor | None:
    """Padded rows [B, H, Lk, D] of a key-side operand's codes on diagonal tiles, or None."""
    codes = num.diagonal_codes(op)
    return None if codes is None else lay.rows_k(codes)


def _on_diagonal(product, codes: torch.Tensor, diag_codes: torch.Tensor | None, diagonal) -> torch.Tensor:
    """``product(codes)``, or ``product(diag_codes)`` where ``diagonal()`` holds: a 4-bit
    operand contracted over keys takes per-key scales on diagonal tiles (NUMERICS.md 6)."""
    out = product(codes)
    return out if diag_codes is None else torch.where(diagonal(), product(diag_codes), out)


def _entry_spec(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale, window_size,
                recipe: "str | Recipe", head_dim: int, seed: int = 0) -> AttnSpec:
    """The entry points' one resolve: a recipe name to its Recipe, softmax_scale None to
    head_dim ** -0.5 (a Recipe and a float pass through unchanged)."""
    scale = softmax_scale if softmax_scale is not None else head_dim ** -0.5
    return AttnSpec(cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), bool(causal), float(scale),
                    tuple(window_size), resolve_recipe(recipe), int(seed))


def emulate_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False,
                    softmax_scale=None, window_size=(-1, -1), recipe: "str | Recipe" = "mxfp8",
                    tiles: NumericsTiles | None = None, record_p: bool = False, seed: int = 0) -> EmulatedForward:
    """The forward of NUMERICS.md 3, keeping what ``emulate_backward`` needs.

    q: [Tq, Hq, D]; k, v: [Tk, Hkv, D] (any float dtype); cu_seqlens_q/k: int32 [B + 1];
    max_seqlen_q/k: ints. recipe: a name of ``flamia.RECIPES`` or a Recipe; softmax_scale:
    None for 1/sqrt(D). tiles: None for ``numerics_tiles(D, recipe)`` (the kernels' at D).
    record_p: keep each key tile's P values in ``p_trace``. seed: the backward's random bits
    where the recipe rounds G stochastically.
    """
    spec = _entry_spec(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale,
                       window_size, recipe, q.shape[-1], seed)
    return _forward(q, k, v, spec, tiles if tiles is not None else numerics_tiles(q.shape[-1], spec.recipe.name),
                    record_p)


def _forward(q, k, v, spec: AttnSpec, tiles: NumericsTiles, record_p: bool = False) -> EmulatedForward:
    """``emulate_forward`` on resolved values: ``spec.recipe`` a Recipe, ``spec.softmax_scale`` a float."""
    recipe, d = spec.recipe, q.shape[-1]
    cu_q, cu_k, max_q, max_k = spec.cu_seqlens_q, spec.cu_seqlens_k, spec.max_seqlen_q, spec.max_seqlen_k
    num = numerics_for(recipe, d)
    lay = make_layout(cu_q, cu_k, max_q, max_k, spec.causal, spec.window_size,
                      q.shape[1], k.shape[1], tile_multiple(*tiles.sizes()))
    q_op, k_op = num.score_operands(q, k, cu_q, cu_k, max_q, max_k)
    v_op = num.operand(v, cu_k, max_k, rotate=False)
    pv = prefix_v_exponent(v_op.exps, cu_q, cu_k, q.shape[0], spec.causal, spec.window_size)
    r = _rows(lay, q_op, k_op, v_op, pv, spec)
    v_diag = _diagonal_rows(lay, num, v_op)

    b, h, lq, _ = r.qc.shape
    m = torch.full((b, h, lq), float("-inf"), device=q.device)
    l = torch.zeros((b, h, lq), device=q.device)
    acc = torch.zeros((b, h, lq, d), device=q.device)
    trace = []
    for tile in _key_tiles(lay, tiles.fwd_block_n, tiles):
        k0, k1 = tile.k0, tile.k1
        scores, x = _scores(r, tile)
        mx = x.amax(-1)
        m_new = torch.where(mx > m + recipe.tau, torch.ceil(mx), m)
        alpha = torch.where(m_new == float("-inf"), torch.ones_like(m), torch.exp2(m - m_new))
        p = num.exp2(x - _finite(m_new)[..., None], forward=True)
        pq = num.p_values(p, scores, m_new, r.vf[:, :, k0:k1], r.rf, tile, forward=True)
        l = l * alpha + num.row_mass(p, pq, scores, m_new, r.vf[:, :, k0:k1], r.rf, tile)
        pv_tile = _on_diagonal(lambda c: pq @ c[:, :, k0:k1], r.vc, v_diag,
                               lambda: tile.diagonal(tiles.fwd_block_m, tiles.diag_block_n)[..., :1])
        acc = acc * alpha[..., None] + pv_tile
        m = m_new
        if record_p:
            trace.append((k0, pq, m.clone()))

    valid = m > float("-inf")
    # l > 0 on every valid row, except with p4_sum_quantized when every weight the row used
    # flushed to zero (a group scale set by keys the row does not see: the leaking ablation):
    # such a row's acc is 0 too, and O = 0 instead of 0 / 0.
    l_safe = torch.where(valid & (l > 0), l, torch.ones_like(l))
    ro = torch.where(valid, exp2i(r.pv - recipe.sigma) / l_safe, torch.zeros_like(l))
    lse = torch.where(valid, (m + torch.log2(l_safe)) * LN2, torch.full_like(l, float("inf")))
    m_saved = torch.where(valid, m, torch.full_like(m, float("inf")))
    tq = q.shape[0]
    out = lay.packed_q((acc * ro[..., None]).to(q.dtype), tq)
    stats = [lay.packed_q(t[..., None], tq)[..., 0].transpose(0, 1).contiguous() for t in (lse, m_saved, ro)]
    return EmulatedForward(out, *stats, q_op, k_op, v_op, pv, (q, k, v), spec, tiles, num, lay, trace)


def _finite(m: torch.Tensor) -> torch.Tensor:
    """Rows without a visible key yet have m = -inf; use 0 there (their x is -inf anyway)."""
    return torch.where(torch.isfinite(m), m, torch.zeros_like(m))


def _rebuild_p(r: _Rows, tile: KeyTile, m: torch.Tensor, num: Numerics) -> torch.Tensor:
    """The backward's P values of a key tile, relative to the saved final row max m
    (NUMERICS.md 4, steps 1-2). [B, H, Lq, N] fp32."""
    scores, x = _scores(r, tile)
    p = num.exp2(x - m[..., None], forward=False)
    return num.p_values(p, scores, m, r.vf[:, :, tile.k0:tile.k1], r.rf, tile, forward=False)


def rebuild_p_trace(fwd: EmulatedForward) -> list[tuple[int, torch.Tensor]]:
    """The backward's P values for each forward key tile, [(k0, P [B, H, Lq, N])], for the
    forward/backward consistency check against ``fwd.p_trace``."""
    lay = fwd.layout
    r = _rows(lay, fwd.q_op, fwd.k_op, fwd.v_op, fwd.pv, fwd.spec)
    m = lay.rows_q(fwd.m.transpose(0, 1), fill=float("inf"))
    return [(t.k0, _rebuild_p(r, t, m, fwd.numerics)) for t in _key_tiles(lay, fwd.tiles.fwd_block_n, fwd.tiles)]


def _grad_words(lay: DocLayout, spec: AttnSpec, tile, heads: int,
                total_q: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The uint32 words (int64) that round G stochastically on one key tile (NUMERICS.md 6) of
    streams 0 (G in dQ) and 1 (G in dK) at packed row h * Tq + i and packed key j
    (``formats.random_bits``), each [B, H, Lq, C]."""
    rows = lay.packing_q.index  # [B, Lq]
    keys = lay.packing_k.index[:, tile.k0:tile.k1]  # [B, C]
    head = torch.arange(heads, device=rows.device)
    packed_rows = head[None, :, None, None] * total_q + rows[:, None, :, None]  # [B, H, Lq, 1]
    keys = keys[:, None, None, :]  # [B, 1, 1, C]
    return tuple(grad_bits(spec.seed, stream, packed_rows, keys) for stream in (0, 1))


def emulate_backward(fwd: EmulatedForward, do: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dO [Tq, Hq, D] -> (dq [Tq, Hq, D], dk [Tk, Hkv, D], dv [Tk, Hkv, D]) fp32, NUMERICS.md 4."""
    spec, tiles, num, lay = fwd.spec, fwd.tiles, fwd.numerics, fwd.layout
    q, k, v = fwd.inputs
    r = _rows(lay, fwd.q_op, fwd.k_op, fwd.v_op, fwd.pv, spec)
    go = num.grad_output(do, fwd.out, fwd.ro, spec.cu_seqlens_q, spec.max_seqlen_q, tiles.bwd_block_m)
    gq, gk = num.grad_operands(q, k, fwd.q_op, fwd.k_op, spec.cu_seqlens_q, spec.cu_seqlens_k,
                               spec.max_seqlen_q, spec.max_seqlen_k)
    doc, dof = lay.rows_q(go.do.codes), lay.rows_q(go.do.factor, fill=1.0)
    dotc, dotf = lay.rows_q(go.dot.codes), lay.rows_q(go.dot.factor, fill=1.0)
    delta = lay.rows_q(go.delta.transpose(0, 1))
    m = lay.rows_q(fwd.m.transpose(0, 1), fill=float("inf"))
    ro = lay.rows_q(fwd.ro.transpose(0, 1))
    qgc, qg = lay.rows_q(gq.codes), lay.rows_q(gq.factor, fill=1.0)
    kgc, kg = lay.rows_k(gk.codes), lay.rows_k(gk.factor, fill=1.0)
    k_diag = _diagonal_rows(lay, num, gk)
    gv = num.value_grad_operand(v, fwd.v_op, spec.cu_seqlens_k, spec.max_seqlen_k)
    vgc, vgf = lay.rows_k(gv.codes), lay.rows_k(gv.factor, fill=1.0)
    vinv = 1.0 / r.vf

    b, h, lq, d = r.qc.shape
    bm, dqn = num.grad_groups(tiles)
    chunk = math.lcm(tiles.bwd_block_n, tiles.dq_block_n)
    dq_acc = torch.zeros_like(r.qc)
    dk_acc = torch.zeros_like(r.kc)
    dv_acc = torch.zeros_like(r.vc)
    q_steps = qgc.unflatten(2, (lq // bm, bm))                      # [B, H, T, bm, D]
    if num.ro_in_p:  # dV = round(P^ ro)^T dO^: ro goes with P, so dV takes dO's row codes
        dotc, dotf = doc, dof
    dot_steps = dotc.unflatten(2, (lq // bm, bm))
    dot_step_f = dotf.unflatten(2, (lq // bm, bm))[..., 0]          # [B, H, T]: constant per step
    for tile in _key_tiles(lay, chunk, tiles):
        k0, k1 = tile.k0, tile.k1
        pq = _rebuild_p(r, tile, m, num)
        pd = (pq * ro[..., None]) * vinv[:, :, None, k0:k1]
        dp = ((doc @ vgc[:, :, k0:k1].transpose(-1, -2)) * dof[..., None]) * vgf[:, :, None, k0:k1]
        ds = pd * (dp - delta[..., None])
        g = (ds * qg[..., None]) * kg[:, :, None, k0:k1]            # [B, H, Lq, C]

        w_dq = w_dk = None
        if spec.recipe.rounds_grad_stochastically:
            w_dq, w_dk = _grad_words(lay, spec, tile, h, q.shape[0])
            w_dq, w_dk = w_dq.unflatten(-1, (chunk // dqn, dqn)), w_dk.unflatten(2, (lq // bm, bm))
        g_rows = g.unflatten(-1, (chunk // dqn, dqn))               # [B, H, Lq, S, dqn]
        e_row = num.grad_exponent(g_rows.abs().amax(-1))            # [B, H, Lq, S]
        g_dq = num.round_grad(g_rows * exp2i(-e_row)[..., None], w_dq)
        dq_steps = _on_diagonal(  # [B, H, Lq, S, D]
            lambda c: torch.einsum("bhqsn,bhsnd->bhqsd", g_dq, c[:, :, k0:k1].unflatten(2, (chunk // dqn, dqn))),
            kgc, k_diag, lambda: tile.diagonal(tiles.dq_block_m, tiles.dq_block_n)[..., ::dqn, None])
        dq_acc += (dq_steps * exp2i(e_row)[..., None]).sum(3)

        g_cols = g.unflatten(2, (lq // bm, bm))                     # [B, H, T, bm, C]
        e_col = num.grad_exponent(g_cols.abs().amax(3))             # [B, H, T, C]
        g_dk = num.round_grad(g_cols * exp2i(-e_col)[:, :, :, None, :], w_dk)
        dk_acc[:, :, k0:k1] += (torch.einsum("bhtmc,bhtmd->bhtcd", g_dk, q_steps) * exp2i(e_col)[..., None]).sum(2)
        p_steps = (num.round_p(pq * ro[..., None]) if num.ro_in_p else pq).unflatten(2, (lq // bm, bm))
        dv_acc[:, :, k0:k1] += (torch.einsum("bhtmc,bhtmd->bhtcd", p_steps, dot_steps)
                                * dot_step_f[..., None, None]).sum(2)

    scale = spec.softmax_scale
    dq = lay.packed_q(dq_acc * (scale * (1.0 / qg))[..., None], q.shape[0])
    dk = lay.packed_k(dk_acc * (scale * (1.0 / kg))[..., None], k.shape[0])
    dv = lay.packed_k(dv_acc * vinv[..., None], k.shape[0])
    if num.hadamard:
        dq, dk = hadamard_transform(dq), hadamard_transform(dk)
    return dq, dk, dv


class _EmulatedAttention(torch.autograd.Function):
    """The emulator under autograd: forward(q, k, v, spec) -> (out, lse); the backward
    returns (dq, dk, dv, None) in the inputs' dtypes."""

    @staticmethod
    def forward(ctx, q, k, v, spec: AttnSpec):
        fwd = _forward(q, k, v, spec, numerics_tiles(q.shape[-1], spec.recipe.name))
        ctx.fwd = fwd
        ctx.mark_non_differentiable(fwd.lse)
        return fwd.out, fwd.lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v = ctx.fwd.inputs
        dq, dk, dv = emulate_backward(ctx.fwd, dout.contiguous())
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None


def emulated_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False,
                       softmax_scale=None, window_size=(-1, -1), recipe="mxfp8", return_lse=False, seed=0):
    """Differentiable emulated attention on packed documents, on the tiles ``numerics_tiles(D, recipe)``.

    Arguments as ``flamia.flash_attn_varlen_func`` (q: [Tq, Hq, D]; k, v: [Tk, Hkv, D]; recipe
    a name or a Recipe; softmax_scale None for 1/sqrt(D)), which hands it a resolved Recipe
    and float scale. Returns out [Tq, Hq, D] in q's dtype, and lse [Hq, Tq] fp32 (natural log,
    not differentiable) when ``return_lse``. seed: the random bits' seed where the recipe
    rounds stochastically (``emulate_forward``)."""
    spec = _entry_spec(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale, window_size,
                       recipe, q.shape[-1], seed)
    out, lse = _EmulatedAttention.apply(q, k, v, spec)
    return (out, lse) if return_lse else out
