"""Session 11: the Q/K/V quantizer variants, bitwise and timed (kernel-only, do_bench medians, rounds interleaved).
python qab.py WORKLOADS ROUNDS. Variants: the Triton V kernel (V); the shipped Gluon rotated
kernel (old_rotq.py) / the transposed codes moved in D/PARTS-row pieces after the row codes (Q, K); each at T_ALIGN 16 and 32."""
import importlib.util, json, math, statistics, sys
import torch
from triton.testing import do_bench
from flamia.bench.workloads import WORKLOADS, make_case
from flamia.kernels import quantize as qz
from flamia.kernels.rotated_quantizer import rotated_operand_kernel as new_rot
from flamia.kernels.worklist import tile_list

spec = importlib.util.spec_from_file_location("flamia.kernels._old_rotq", "scratch/calls/old_rotq.py")
old = importlib.util.module_from_spec(spec); sys.modules[spec.name] = old; spec.loader.exec_module(old)
U = 32


def starts(cu, a):
    spans = (cu[1:] - cu[:-1] + a - 1) // a * a
    out = torch.zeros_like(cu); out[1:] = torch.cumsum(spans, 0, dtype=cu.dtype)
    return out


rounds = int(sys.argv[2])
for name in sys.argv[1].split(","):
    i = make_case(WORKLOADS[name], "cuda").inputs
    cu = i.cu_seqlens
    n = cu.numel() - 1
    work = tile_list(cu, i.q.shape[0], U, reverse=False, empty_docs=True)
    res = {}
    for which, x, rot in (("V", i.v, False), ("Q", i.q, True)):
        x = x.detach().contiguous()
        T, H, D = x.shape
        nbytes = x.numel() * (x.element_size() + 1 + 1) + T * H
        for a in (16, 32):
            cu_t = starts(cu, a)
            T_t = -(-T // a) * a + a * n
            kernels = {"V": [("triton", qz._quantize_operand_kernel, 2, {})],
                       "Q": [("shipped", old.rotated_operand_kernel, 1, {}), ("parts4", new_rot, 1, {"PARTS": 4}),
                             ("parts2", new_rot, 1, {"PARTS": 2})]}[which]
            outs = {}
            for label, kern, warps, more in kernels:
                codes = torch.empty((T, H, D), dtype=torch.float8_e4m3fn, device=x.device)
                codes_t = torch.empty((H, D, T_t), dtype=torch.float8_e4m3fn, device=x.device)
                codes_t.view(torch.uint8).fill_(0xFF)
                exps = torch.empty((T, H), dtype=torch.int8, device=x.device)
                extra = dict(TRANSPOSED=True, INTERPRET=False) if kern is qz._quantize_operand_kernel else {}
                args = (x, codes, codes_t, exps, cu, cu_t, work, work.shape[1], n)
                kw = dict(T_t=T_t, H=H, inv_sqrt_d=1.0 / math.sqrt(D), D=D, UNIT=U, BLOCK=32,
                          HADAMARD_STAGES=D.bit_length() - 1 if rot else 0, T_ALIGN=a, num_warps=warps, **extra, **more)
                fn = (lambda kern=kern, args=args, kw=kw: kern[(work.shape[1], H)](*args, **kw))
                fn(); torch.cuda.synchronize()
                outs[label] = (fn, codes, codes_t, exps)
            u8 = lambda t: t.view(torch.uint8)
            (_, c0, t0, e0), *others = outs.values()
            same = all(torch.equal(u8(c0), u8(c)) and torch.equal(u8(t0), u8(t)) and torch.equal(e0, e) for _, c, t, e in others)
            nan_left = sum(int((u8(t) == 0xFF).sum()) for _, c, t, e in outs.values())
            times = {l: [] for l in outs}
            for _ in range(rounds):
                for l, (fn, *_r) in outs.items():
                    times[l].append(do_bench(fn, warmup=5, rep=40, return_mode="median"))
            for l, ts in times.items():
                ms = statistics.median(ts)
                res[f"{which}/{l}/A{a}"] = {"ms": round(ms, 4), "TBps": round(nbytes / ms / 1e9, 3)}
            res[f"{which}/A{a}/bitwise"] = same
            res[f"{which}/A{a}/ff_bytes_left"] = nan_left
    print(json.dumps({"workload": name, **res}), flush=True)
