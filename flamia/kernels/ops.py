"""The MXFP8 training call on the GPU: quantize -> forward -> (autograd) -> backward.

Glue only: every launch lives in quantize.py, attn_fwd.py and attn_bwd.py. Nothing here reads
a device value on the host, so a whole training step captures in a CUDA graph.
"""
import torch

from ..recipes import resolve_recipe
from ..spec import AttnSpec
from .attn_bwd import attention_backward
from .attn_fwd import attention_forward
from .configs import tiles_for
from .layout import aligned_starts
from .prefix import prefix_v_exponent
from .records import key_records
from .quantize import quantize_grad_output, quantize_operand


class _TritonAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, spec: AttnSpec):
        # The quantizer reads whole rows: views such as a split of a fused QKV projection
        # (stride(-1) == 1, as the API requires) are copied once here.
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        recipe, d = spec.recipe, q.shape[-1]
        tiles, rotate, block = tiles_for(d), recipe.use_hadamard(d), recipe.scale_block
        # Q^T and K^T are written now, in the launch that reads Q and K anyway: the backward's
        # dK = G^T Q^ and dQ = G K^ need them as K-major FP8 operands. Transposed codes start
        # every document at a multiple of 32 columns (layout.py): those starts and the
        # quantizers' tile list, built once per side (Q's serve K and V when both sides share
        # cu_seqlens), travel with the operands to the kernels.
        shared = spec.cu_seqlens_k is spec.cu_seqlens_q
        cu_qt = aligned_starts(spec.cu_seqlens_q)
        cu_kt = cu_qt if shared else aligned_starts(spec.cu_seqlens_k)
        qq = quantize_operand(q, spec.cu_seqlens_q, block, rotate, True, cu_qt)
        kq = quantize_operand(k, spec.cu_seqlens_k, block, rotate, True, cu_kt, work=qq.work if shared else None)
        vq = quantize_operand(v, spec.cu_seqlens_k, block, False, True, cu_kt, work=kq.work)
        key_rec = key_records(kq.exps, vq.exps)  # read by the forward and the backward's dQ
        pv = prefix_v_exponent(vq.exps, spec.cu_seqlens_q, spec.cu_seqlens_k, q.shape[0], spec.causal,
                               spec.window_size, block)
        out, lse, m, ro = attention_forward(
            qq.codes, qq.exps, kq.codes, kq.exps, vq.codes_t, vq.exps, pv, spec.cu_seqlens_q, spec.cu_seqlens_k,
            vq.cu_seqlens_t, causal=spec.causal, window_size=spec.window_size,
            softmax_scale=spec.softmax_scale, tau=recipe.tau, sigma=recipe.sigma, scale_block=block, tiles=tiles,
            key_rec=key_rec)
        ctx.spec, ctx.operands, ctx.rotate, ctx.key_rec = spec, (qq, kq, vq), rotate, key_rec
        ctx.save_for_backward(out, m, ro, pv)
        ctx.mark_non_differentiable(lse)
        return out.to(q.dtype), lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        spec, (qq, kq, vq) = ctx.spec, ctx.operands
        out, m, ro, pv = ctx.saved_tensors
        tiles = tiles_for(out.shape[-1])
        go = quantize_grad_output(dout.contiguous(), out, ro, spec.cu_seqlens_q, spec.recipe.scale_block,
                                  tiles.bwd_block_m, qq.cu_seqlens_t)
        dq, dk, dv = attention_backward(
            qq.codes, qq.codes_t, qq.exps, kq.codes, kq.codes_t, kq.exps, vq.codes, vq.exps,
            go.do_codes, go.do_exps, go.dot_codes_t, go.dot_exps, go.delta, m, ro, pv,
            spec.cu_seqlens_q, spec.cu_seqlens_k, qq.cu_seqlens_t, kq.cu_seqlens_t,
            causal=spec.causal, window_size=spec.window_size, softmax_scale=spec.softmax_scale,
            sigma=spec.recipe.sigma, scale_block=spec.recipe.scale_block, tiles=tiles, rotate=ctx.rotate,
            out_dtype=dout.dtype, key_rec=ctx.key_rec)
        return dq, dk, dv, None


def triton_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False,
                     softmax_scale=None, window_size=(-1, -1), recipe="mxfp8", return_lse=False):
    """MXFP8 attention on packed documents with the Triton kernels; same contract as
    ``flamia.reference.emulated.emulated_attention`` (out in q's dtype; lse [Hq, Tq] fp32)."""
    spec = AttnSpec(cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), bool(causal),
                    float(softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5),
                    tuple(window_size), resolve_recipe(recipe))
    out, lse = _TritonAttention.apply(q, k, v, spec)
    return (out, lse) if return_lse else out
