"""Quantizer sweep: UNIT x warps x stages for Q/K (Hadamard) and V (none), bitwise-checked against the default."""
import itertools, json, math, sys
import torch
from triton.testing import do_bench
from flamia.bench.workloads import WORKLOADS, make_case
from flamia.kernels import quantize as qz
from flamia.kernels.fp8 import interpreting
from flamia.kernels.layout import T_ALIGN, aligned_starts
from flamia.kernels.worklist import tile_list

def launch(x, cu, cu_t, hadamard, unit, warps, stages):
    total, heads, d = x.shape
    codes = torch.empty((total, heads, d), dtype=torch.float8_e4m3fn, device=x.device)
    codes_t = qz._transposed_codes(heads, d, total, cu)
    exps = torch.empty((total, heads), dtype=torch.int8, device=x.device)
    work = tile_list(cu, total, unit, reverse=False, empty_docs=True)
    def run():
        qz._quantize_operand_kernel[(work.shape[1], heads)](
            x, codes, codes_t, exps, cu, cu_t, work, work.shape[1], cu.numel() - 1, T_t=codes_t.shape[2], H=heads,
            inv_sqrt_d=1.0 / math.sqrt(d), D=d, UNIT=unit, BLOCK=32,
            HADAMARD_STAGES=d.bit_length() - 1 if hadamard else 0, TRANSPOSED=True, T_ALIGN=T_ALIGN,
            INTERPRET=False, num_warps=warps, num_stages=stages)
    run()
    return run, (codes, codes_t, exps)

for name in sys.argv[1].split(","):
    i = make_case(WORKLOADS[name], "cuda").inputs
    x, cu = i.q.detach().contiguous(), i.cu_seqlens
    cu_t = aligned_starts(cu)
    nbytes = x.numel() * (2 + 1 + 1) + x.shape[0] * x.shape[1]
    for hadamard in (False, True):
        ref = None
        shapes = json.loads(sys.argv[2]) if len(sys.argv) > 2 else [
            [u, w, st] for u, w, st in itertools.product((32, 64, 128), (2, 4, 8), (1, 3)) if not (u == 128 and w == 2)]
        for unit, warps, stages in shapes:
            try:
                run, out = launch(x, cu, cu_t, hadamard, unit, warps, stages)
            except Exception as e:
                print(json.dumps({"workload": name, "hadamard": hadamard, "unit": unit, "warps": warps, "stages": stages, "error": str(e)[:200]})); continue
            if ref is None:
                ref = [t.clone() for t in out]
            same = all(torch.equal(a.view(torch.uint8) if a.dtype == torch.float8_e4m3fn else a,
                                   b.view(torch.uint8) if b.dtype == torch.float8_e4m3fn else b) for a, b in zip(out, ref))
            ms = do_bench(run, warmup=10, rep=50, return_mode="median")
            print(json.dumps({"workload": name, "hadamard": hadamard, "unit": unit, "warps": warps, "stages": stages,
                              "ms": round(ms, 4), "TBps": round(nbytes / ms / 1e9, 3), "same": same}), flush=True)
