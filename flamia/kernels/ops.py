"""The MXFP8, BF16, mixed NVFP4 and all-4-bit training calls on the GPU as two functions, forward
and backward, for the custom ops of ``flamia/ops.py``: quantize -> forward, then quantize dO ->
backward; 8 launches in all (plan, Q and K, V, PV, forward; dO, dK/dV, dQ), 7 where bf16 Q and
K are the bf16 route's own codes (``inputs_are_codes``: no Q and K launch).

Glue only: every launch lives in plan.py, quantize.py, prefix.py, attn_fwd.py and attn_bwd.py. Nothing here reads
a device value on the host, so a whole training step captures in a CUDA graph.

``forward_eager`` and ``backward_eager`` are the same calls for eager autograd: after a shape's
first call they replay its recorded launches (``replay.py``), and the forward's residuals
travel as one workspace tensor.
"""
from typing import NamedTuple

import torch

from ..recipes import Recipe
from ..spec import AttnSpec
from .attn_bwd import attention_backward
from .attn_fwd import attention_forward
from .configs import grad_mode, p4_mode, route_for, row_sum_mode, tiles_for
from .layout import transposed_extent
from .plan import build_plan, plan_layout
from .prefix import prefix_v_exponent
from .quantize import quantize_grad_output, quantize_operand, quantize_pair
from .quantize_fp4 import quantize_fp4_grad_output, quantize_fp4_operand, quantize_fp4_pair
from . import replay
from .launch import _device


class Residuals(NamedTuple):
    """What the backward reads of the forward: the codes (row-major [T, H, D] and transposed
    [H, D, T_t], float8_e4m3fn, or bfloat16 for the BF16 recipe, whose backward reads no
    transposed Q and K codes: None, ``Route.rows``; the row-major Q and K codes
    of the mixed NVFP4 route and of ``bf16_scores`` are their bf16 score codes) and int8 exponents [T, H] of Q and K,
    V's codes and exponents, the transposed codes' document starts cu_qt, cu_kt (int32 [num_docs + 1]),
    the key records [Hkv, Tk] int32, the row statistics m, ro [Hq, Tq] fp32, PV [Tq, Hkv]
    int32 and the call's work lists (``plan.build_plan``'s buffer, int32). The all-4-bit route's
    codes are bfloat16 values with every scale folded in (exponents 0): Q, K and V row-major in
    NVFP4, the transposed ones in 16-token groups, and k_codes_t_diag, K^T with per-key scales
    (None on the other routes: ``tensors`` leaves it out)."""

    q_codes: torch.Tensor
    q_codes_t: torch.Tensor | None
    q_exps: torch.Tensor
    k_codes: torch.Tensor
    k_codes_t: torch.Tensor | None
    k_exps: torch.Tensor
    v_codes: torch.Tensor
    v_exps: torch.Tensor
    cu_qt: torch.Tensor
    cu_kt: torch.Tensor
    key_rec: torch.Tensor
    m: torch.Tensor
    ro: torch.Tensor
    pv: torch.Tensor
    work: torch.Tensor
    k_codes_t_diag: torch.Tensor | None = None

    def tensors(self) -> list[torch.Tensor]:
        """The fields that are tensors, in order: what a custom op returns and autograd saves."""
        return [t for t in self if t is not None]

    @classmethod
    def from_tensors(cls, tensors: list[torch.Tensor], spec: AttnSpec, dtype: torch.dtype) -> "Residuals":
        """``tensors()`` of the call ``spec`` on inputs of ``dtype`` back as Residuals, the
        fields its route leaves None put back."""
        route = route_for(spec.recipe)
        absent = {"q_codes_t", "k_codes_t"} if route.rows else set()
        absent |= {"q_codes", "q_exps", "k_codes", "k_exps"} if inputs_are_codes(spec.recipe, dtype) else set()
        absent |= set() if route.all4 else {"k_codes_t_diag"}
        given = iter(tensors)
        return cls(*(None if name in absent else next(given) for name in cls._fields))


def inputs_are_codes(recipe: Recipe, dtype: torch.dtype) -> bool:
    """Whether Q and K of ``dtype`` are their own codes under ``recipe``: the bf16 route's BF16
    codes of bf16 values are the values' bits with exponents 0, so no launch writes them, the
    kernels read the inputs, and the residuals leave Q^, K^ and their exponents out (the
    caller keeps Q and K for the backward: ``own_inputs``)."""
    return route_for(recipe).rows and dtype == torch.bfloat16


def own_inputs(q: torch.Tensor, k: torch.Tensor, spec: AttnSpec) -> list[torch.Tensor]:
    """[q, k] where they are their own codes (``inputs_are_codes``), else []: what autograd
    keeps beside the residuals."""
    return [q, k] if inputs_are_codes(spec.recipe, q.dtype) else []


def grad_output_is_codes(recipe: Recipe, do: torch.Tensor) -> bool:
    """Whether dO is its own dO^ (``quantize_grad_output``'s own_codes): bf16 on the bf16 route,
    where TMA can read it (16-byte aligned)."""
    return route_for(recipe).rows and do.dtype == torch.bfloat16 and do.data_ptr() % 16 == 0


def _tma_ready(x: torch.Tensor) -> torch.Tensor:
    """x, or a copy where its address is not 16-byte aligned (TMA's base)."""
    return x if x.data_ptr() % 16 == 0 else x.clone()


def residual_tensors(res: Residuals, spec: AttnSpec, dtype: torch.dtype) -> list[torch.Tensor]:
    """The tensors the forward made for the backward (a custom op's third output, a replayed
    call's workspace): ``res.tensors()`` without Q's and K's codes where those are the inputs
    of ``dtype`` themselves (``inputs_are_codes``)."""
    if inputs_are_codes(spec.recipe, dtype):
        res = res._replace(q_codes=None, k_codes=None)
    return res.tensors()


def saved_for_backward(res: Residuals, q: torch.Tensor, k: torch.Tensor, spec: AttnSpec) -> list[torch.Tensor]:
    """What autograd keeps for the backward: ``residual_tensors``, then Q and K where they are
    their own codes (``split_saved`` inverts it)."""
    return residual_tensors(res, spec, q.dtype) + own_inputs(q, k, spec)


def split_saved(saved: list[torch.Tensor], spec: AttnSpec, dtype: torch.dtype) -> Residuals:
    """``saved_for_backward``'s list (``dtype``: the inputs') back as the backward's Residuals,
    Q's and K's codes the inputs themselves where they are their own."""
    if not inputs_are_codes(spec.recipe, dtype):
        return Residuals.from_tensors(saved, spec, dtype)
    *rest, q, k = saved
    return Residuals.from_tensors(rest, spec, dtype)._replace(q_codes=q.contiguous(), k_codes=k.contiguous())


def empty_residuals(q: torch.Tensor, k: torch.Tensor, spec: AttnSpec) -> Residuals:
    """Residuals of the right shapes and dtypes, uninitialised: the custom op's fake."""
    (tq, hq, d), (tk, hkv) = q.shape, k.shape[:2]
    num_docs = spec.cu_seqlens_q.shape[0] - 1
    route = route_for(spec.recipe)
    plan = plan_layout(tq, tk, num_docs, tiles_for(d, route))
    tq_t, tk_t = transposed_extent(tq, num_docs), transposed_extent(tk, num_docs)
    codes, scores = route.codes.torch_dtype, route.scores.torch_dtype
    i8, i32, f32 = torch.int8, torch.int32, torch.float32

    def new(shape, dtype):
        return q.new_empty(shape, dtype=dtype)

    q_t, k_t = (None, None) if route.rows else (new((hq, d, tq_t), codes), new((hkv, d, tk_t), codes))
    own = inputs_are_codes(spec.recipe, q.dtype)
    return Residuals(None if own else new((tq, hq, d), scores), q_t, None if own else new((tq, hq), i8),
                     None if own else new((tk, hkv, d), scores), k_t, None if own else new((tk, hkv), i8),
                     new((tk, hkv, d), codes), new((tk, hkv), i8),
                     new((num_docs + 1,), i32), new((num_docs + 1,), i32), new((hkv, tk), i32),
                     new((hq, tq), f32), new((hq, tq), f32), new((tq, hkv), i32), new((plan.words,), i32),
                     new((hkv, d, tk_t), codes) if route.all4 else None)


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            spec: AttnSpec) -> tuple[torch.Tensor, torch.Tensor, Residuals]:
    """out [Tq, Hq, D] in q's dtype, lse [Hq, Tq] fp32 and the backward's ``Residuals``."""
    # The quantizer reads whole rows: views such as a split of a fused QKV projection
    # (stride(-1) == 1, as the API requires) are copied once here.
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    recipe, d = spec.recipe, q.shape[-1]
    route = route_for(recipe)
    fmt = route.codes
    tiles, rotate, block = tiles_for(d, route), recipe.use_hadamard(d), recipe.scale_block
    # Q^T and K^T are written now, in the launch that reads Q and K anyway: the backward's
    # dK = G^T Q^ and dQ = G K^ need them as K-major FP8 operands (BF16 reads the rows:
    # Route.rows). The transposed codes' document starts and every launch's work list come
    # from one launch (Q's quantizer list serves K and V when both sides share cu_seqlens);
    # Q and K share a launch, and V's writes the key records. Row-major Q and K codes are the
    # scores' (``Route.score_codes``).
    plan = build_plan(spec.cu_seqlens_q, spec.cu_seqlens_k, q.shape[0], k.shape[0], tiles)
    k_work = plan.work("k_operand")
    if inputs_are_codes(recipe, q.dtype):  # Q and K read as they are: no Q/K launch
        qq = kq = None
        vq = quantize_operand(v, spec.cu_seqlens_k, block, False, True, plan.cu_kt, work=k_work, fmt=fmt,
                              key_records=True)
    elif route.all4:  # K and V also with per-key scales, for the diagonal tiles
        qq, kq = quantize_fp4_pair(q, k, spec.cu_seqlens_q, spec.cu_seqlens_k, rotate, plan.cu_qt, plan.cu_kt,
                                   plan.work("q_operand"), k_work)
        vq = quantize_fp4_operand(v, spec.cu_seqlens_k, False, True, plan.cu_kt, k_work, key_records=True)
    else:
        qq, kq = quantize_pair(q, k, spec.cu_seqlens_q, spec.cu_seqlens_k, block, rotate, plan.cu_qt, plan.cu_kt,
                               plan.work("q_operand"), k_work, fmt, scores=route.score_codes,
                               transposed=not route.rows)
        vq = quantize_operand(v, spec.cu_seqlens_k, block, False, True, plan.cu_kt, work=k_work, key_exps=kq.exps,
                              fmt=fmt)
    # (codes, transposed codes, exponents) of Q and of K, as Residuals holds them
    q_side = (_tma_ready(q), None, None) if qq is None else (qq.codes, qq.codes_t, qq.exps)
    k_side = (_tma_ready(k), None, None) if kq is None else (kq.codes, kq.codes_t, kq.exps)
    key_rec = vq.key_rec  # read by the forward and the backward's dQ
    pv = prefix_v_exponent(vq.exps, spec.cu_seqlens_q, spec.cu_seqlens_k, q.shape[0], spec.causal,
                           spec.window_size, block)
    out, lse, m, ro = attention_forward(
        q_side[0], q_side[2], k_side[0], k_side[2], vq.codes_t, vq.exps, pv, spec.cu_seqlens_q, spec.cu_seqlens_k,
        vq.cu_seqlens_t, causal=spec.causal, window_size=spec.window_size,
        softmax_scale=spec.softmax_scale, tau=recipe.tau, sigma=recipe.sigma, scale_block=block, tiles=tiles,
        key_rec=key_rec, work=plan.work("fwd"), p4=p4_mode(recipe, forward=True), row_sum=row_sum_mode(recipe),
        diag_block_m=recipe.fwd_diag_block_m, approx_exp=recipe.fwd_approx_exp,
        v_codes_t_diag=vq.codes_t_diag if route.all4 else None, out_dtype=q.dtype)
    res = Residuals(*q_side, *k_side, vq.codes, vq.exps, plan.cu_qt, plan.cu_kt, key_rec, m, ro, pv, plan.buffer,
                    kq.codes_t_diag if route.all4 else None)
    return out, lse, res


def backward(dout: torch.Tensor, out: torch.Tensor, res: Residuals,
             spec: AttnSpec) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq [Tq, Hq, D], dk, dv [Tk, Hkv, D] in dout's dtype from dO and the forward's out
    (the inputs' dtype) and residuals (``split_saved``'s, with Q's and K's codes)."""
    recipe, route = spec.recipe, route_for(spec.recipe)
    fmt = route.codes
    tiles = tiles_for(out.shape[-1], route)
    num_docs = spec.cu_seqlens_q.shape[0] - 1
    # Q's and K's codes may be the inputs themselves, which the kernels read by TMA
    res = res._replace(q_codes=_tma_ready(res.q_codes), k_codes=_tma_ready(res.k_codes))
    plan = plan_layout(out.shape[0], res.k_codes.shape[0], num_docs, tiles)
    # The dO launch also writes the query records that both backward kernels read.
    records = dict(work=plan.view(res.work, "grad_out"), q_exps=res.q_exps, pv=res.pv, m=res.m, sigma=recipe.sigma)
    if route.all4:
        go = quantize_fp4_grad_output(dout.contiguous(), out.contiguous(), res.ro, spec.cu_seqlens_q,
                                      tiles.bwd_block_m, res.cu_qt, **records)
    else:
        do = dout.contiguous()
        go = quantize_grad_output(do, out.contiguous(), res.ro, spec.cu_seqlens_q, recipe.scale_block,
                                  tiles.bwd_block_m, res.cu_qt, fmt=fmt, transposed=not route.rows,
                                  own_codes=grad_output_is_codes(recipe, do), dot_values=route.dot_values, **records)
    return attention_backward(
        res.q_codes, res.q_codes_t, res.q_exps, res.k_codes, res.k_codes_t, res.k_exps, res.v_codes, res.v_exps,
        go.do_codes, go.do_exps, go.dot_codes_t, go.dot_exps, go.delta, res.m, res.ro, res.pv,
        spec.cu_seqlens_q, spec.cu_seqlens_k, res.cu_qt, res.cu_kt,
        causal=spec.causal, window_size=spec.window_size, softmax_scale=spec.softmax_scale,
        sigma=spec.recipe.sigma, scale_block=spec.recipe.scale_block, tiles=tiles,
        rotate=spec.recipe.use_hadamard(out.shape[-1]), out_dtype=dout.dtype, key_rec=res.key_rec,
        records=go.records, dkdv_work=plan.view(res.work, "dkdv"), dq_work=plan.view(res.work, "dq"),
        p4=p4_mode(recipe, forward=False), grad4=grad_mode(recipe), k_codes_t_diag=res.k_codes_t_diag,
        seed=spec.seed)


_programs = replay.Programs()  # forward programs by call key; each holds its backward's by dO's


def _aligned(*tensors: torch.Tensor) -> bool:
    """Every address 16-byte aligned, as the recorded launches were specialized."""
    acc = 0
    for t in tensors:
        acc |= t.data_ptr()
    return not acc & 15


def _inputs(spec: AttnSpec, *tensors: torch.Tensor) -> list:
    """A call's input tensors, the key side's document starts left out when both sides share them."""
    shared = spec.cu_seqlens_k is spec.cu_seqlens_q
    return [*tensors, spec.cu_seqlens_q] + ([] if shared else [spec.cu_seqlens_k])


def forward_eager(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  spec: AttnSpec) -> tuple[torch.Tensor, torch.Tensor, list, "replay.Program | None"]:
    """``forward`` for eager autograd: (out, lse, the tensors to save, the program that made
    them or None). With a program the saved tensors are its workspace, then Q and K where they
    are their own codes (``saved_for_backward``)."""
    inputs = _inputs(spec, q, k, v)
    program = key = None
    # a program replays its recorded launch arguments, and a stochastic G's seed changes per call
    if replay.available() and _aligned(*inputs) and grad_mode(spec.recipe) != 2:
        cu_q, cu_k = spec.cu_seqlens_q, spec.cu_seqlens_k
        key = (q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype, k.dtype, v.dtype, cu_q.shape,
               cu_k.shape, cu_q.stride(), cu_k.stride(), cu_k is cu_q, spec.causal, spec.softmax_scale,
               spec.window_size, spec.recipe, q.device, _device())
        program = _programs.get(key)
    if program is None or program is ...:
        with replay.record(enabled=program is ...) as (launches, ops):
            out, lse, res = forward(q, k, v, spec)
        if program is ...:
            _programs.put(key, replay.Program.try_build(launches, ops, inputs, [out, lse],
                                                        residual_tensors(res, spec, q.dtype)))
        return out, lse, saved_for_backward(res, q, k, spec), None
    (out, lse), workspace = program(inputs, q.device)
    return out, lse, [workspace, *own_inputs(q, k, spec)], program


def backward_eager(dout: torch.Tensor, out: torch.Tensor, saved: list, spec: AttnSpec,
                   program: "replay.Program | None") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``backward`` for eager autograd, from ``forward_eager``'s saved tensors and program."""
    if program is None:
        return backward(dout, out, split_saved(saved, spec, out.dtype), spec)
    workspace, *own_inputs = saved  # Q and K where they are their own codes
    inputs = _inputs(spec, dout, out, workspace, *own_inputs)
    key = (dout.shape, dout.dtype, dout.stride(), out.dtype, out.stride(), _device())
    grads = program.backward.get(key) if replay.available() and _aligned(dout, out, *own_inputs) else None
    if grads is None or grads is ...:
        res = split_saved(program.views(workspace) + own_inputs, spec, out.dtype)
        with replay.record(enabled=grads is ...) as (launches, ops):
            dq, dk, dv = backward(dout, out, res, spec)
        if grads is ...:
            program.backward.put(key, replay.Program.try_build(launches, ops, inputs, [dq, dk, dv], []))
        return dq, dk, dv
    (dq, dk, dv), _ = grads(inputs, dout.device)
    return dq, dk, dv
