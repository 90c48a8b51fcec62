"""Rotated quantizer: the Gluon launch (quantize_operand) against the Triton kernel, bitwise and timed (kernel-only)."""
import json, math, sys
import torch
from triton.testing import do_bench
from flamia.bench.workloads import WORKLOADS, make_case
from flamia.kernels import quantize as qz
from flamia.kernels.configs import QUANTIZER
from flamia.kernels.layout import T_ALIGN, aligned_starts
from flamia.kernels.worklist import tile_list

for name in sys.argv[1].split(","):
    i = make_case(WORKLOADS[name], "cuda").inputs
    x, cu = i.q.detach().contiguous(), i.cu_seqlens
    cu_t = aligned_starts(cu)
    total, heads, d = x.shape
    work = tile_list(cu, total, QUANTIZER.operand_unit, reverse=False, empty_docs=True)
    nbytes = x.numel() * (x.element_size() + 1 + 1) + total * heads
    g_codes, g_exps = torch.empty_like(codes := torch.empty((total, heads, d), dtype=torch.float8_e4m3fn, device=x.device)), torch.empty((total, heads), dtype=torch.int8, device=x.device)
    g_codes_t = qz._transposed_codes(heads, d, total, cu)
    g_codes_t.view(torch.uint8).fill_(0xFF)
    def new():
        qz.rotated_operand_kernel[(work.shape[1], heads)](
            x, g_codes, g_codes_t, g_exps, cu, cu_t, work, work.shape[1], cu.numel() - 1, T_t=g_codes_t.shape[2], H=heads,
            inv_sqrt_d=1.0 / math.sqrt(d), D=d, UNIT=QUANTIZER.operand_unit, BLOCK=32, HADAMARD_STAGES=d.bit_length() - 1,
            T_ALIGN=T_ALIGN, num_warps=QUANTIZER.rotated_warps)
    api = qz.quantize_operand(x, cu, 32, True, True, cu_t, work)
    codes = torch.empty((total, heads, d), dtype=torch.float8_e4m3fn, device=x.device)
    codes_t = qz._transposed_codes(heads, d, total, cu)
    codes_t.view(torch.uint8).fill_(0xFF)
    exps = torch.empty((total, heads), dtype=torch.int8, device=x.device)
    def old():
        qz._quantize_operand_kernel[(work.shape[1], heads)](
            x, codes, codes_t, exps, cu, cu_t, work, work.shape[1], cu.numel() - 1, T_t=codes_t.shape[2], H=heads,
            inv_sqrt_d=1.0 / math.sqrt(d), D=d, UNIT=QUANTIZER.operand_unit, BLOCK=32, HADAMARD_STAGES=d.bit_length() - 1,
            TRANSPOSED=True, T_ALIGN=T_ALIGN, INTERPRET=False, num_warps=QUANTIZER.rotated_warps)
    old()
    new()
    u8 = lambda t: t.view(torch.uint8)
    same = {"codes": torch.equal(u8(g_codes), u8(codes)), "exps": torch.equal(g_exps, exps),
            "codes_t": torch.equal(u8(g_codes_t), u8(codes_t)),
            "api": torch.equal(u8(api.codes_t), u8(codes_t)) and torch.equal(u8(api.codes), u8(codes))}
    if not same["codes_t"]:
        bad = (u8(g_codes_t) != u8(codes_t)).nonzero()
        same["bad_n"] = bad.shape[0]; same["bad_first"] = bad[:4].tolist(); same["bad_d_hist"] = torch.bincount(bad[:, 1] % 16).tolist()
    t_old = do_bench(old, warmup=10, rep=60, return_mode="median")
    t_new = do_bench(new, warmup=10, rep=60, return_mode="median")
    print(json.dumps({"workload": name, "same": same, "triton_ms": round(t_old, 4), "gluon_ms": round(t_new, 4),
                      "triton_TBps": round(nbytes / t_old / 1e9, 3), "gluon_TBps": round(nbytes / t_new / 1e9, 3)}), flush=True)
