"""Session 13: accuracy at d=64 (4 x 4096, 16 heads, causal) of the Triton kernels with d=64's tiles and with
the d=128 tiles it ran before: cos to FP32 and relative norm to the emulator of O, dQ, dK, dV."""
import json, sys
from dataclasses import replace
import torch
sys.path.insert(0, "benchmarks")
from kernel_check import grads, cos, rel
import flamia.kernels.configs as configs
from flamia.bench.workloads import WORKLOADS, make_case
from flamia.kernels.ops import triton_attention
from flamia.reference.emulated import emulated_attention
from flamia.reference.exact import exact_attention

w = WORKLOADS["eq4x4k-d64"]
i = make_case(w, "cuda").inputs
q, k, v = (x.detach().float().requires_grad_() for x in (i.q, i.k, i.v))
ref, _ = exact_attention(q, k, v, i.cu_seqlens, i.cu_seqlens, i.max_seqlen, i.max_seqlen, causal=True, dtype=torch.float32)
ref.backward(i.do.float())
exact = (ref, q.grad, k.grad, v.grad)
names = ("O", "dQ", "dK", "dV")
for label, tiles in (("d64 tiles", configs.TILES_D64), ("d128 tiles", configs.AttnTiles())):
    configs.TILES[64] = tiles
    tri = grads(triton_attention, i)
    emu = grads(emulated_attention, i)
    t4, e4 = (tri[0], *tri[2:]), (emu[0], *emu[2:])
    print(label, json.dumps({"cos_fp32": {n: round(cos(a, b), 5) for n, a, b in zip(names, t4, exact)},
                             "emu_cos_fp32": {n: round(cos(a, b), 5) for n, a, b in zip(names, e4, exact)},
                             "rel_vs_emulator": {n: round(rel(a, b), 5) for n, a, b in zip(names, t4, e4)}}), flush=True)
