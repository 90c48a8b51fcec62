"""One device call for the MXFP8 kernels: correctness at real sizes, CUDA-graph replay, the
SASS, then speed against FlashAttention-2 (BF16) on the six causal workloads.

Usage (on the GPU machine, repo root): PYTHONPATH=. python3 benchmarks/kernel_check.py [--out DIR]
Prints a short table last; writes kernel_check.json to --out (default $OUT or .).
``--once WORKLOAD [--tiles JSON]`` only runs the quantizers and both kernels twice (compile,
then once more) for a profiler, e.g. ``ncu --kernel-name regex:dkdv --launch-skip 1
--launch-count 1 python3 benchmarks/kernel_check.py --once eq8x8k``.
Kernel-only times exclude quantization (the paper's Tables 2-3); train includes it.
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import replace

import torch
import triton
from triton.testing import do_bench

import flamia
from flamia.bench.flops import tflops_per_s
from flamia.bench.peers_torch import fa2_job
from flamia.bench.workloads import GROUPS, WORKLOADS, make_case
from flamia.bench.jobs import autograd_job
from flamia.bench.timing import kernel_times
from flamia.kernels.attn_bwd import attention_backward
from flamia.kernels.attn_fwd import attention_forward
from flamia.kernels.configs import tiles_for
from flamia.kernels.quantize import quantize_grad_output, quantize_operand
from flamia.reference.exact import exact_attention
from flamia.scaling import prefix_v_exponent


def triton_attention(*args, **kwargs):
    return flamia.flash_attn_varlen_func(*args, backend="triton", **kwargs)


def emulated_attention(*args, **kwargs):
    return flamia.flash_attn_varlen_func(*args, backend="reference", **kwargs)


def cos(a, b):
    return torch.nn.functional.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0).item()


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def grads(attn, i, causal=True):
    q, k, v = (x.detach().clone().requires_grad_() for x in (i.q, i.k, i.v))
    out, lse = attn(q, k, v, i.cu_seqlens, i.cu_seqlens, i.max_seqlen, i.max_seqlen, causal=causal, return_lse=True)
    out.backward(i.do)
    return out.detach(), lse, q.grad, k.grad, v.grad


def correctness(report):
    case = make_case(WORKLOADS["eq4x4k"], "cuda")
    i = case.inputs
    tri = grads(triton_attention, i)
    emu = grads(emulated_attention, i)
    names = ("O", "lse", "dQ", "dK", "dV")
    report["vs_emulator"] = {n: rel(a, b) for n, a, b in zip(names, tri, emu) if n != "lse"}
    report["vs_emulator"]["lse_maxabs"] = (tri[1] - emu[1]).abs().max().item()
    q, k, v = (x.detach().float().requires_grad_() for x in (i.q, i.k, i.v))
    ref, _ = exact_attention(q, k, v, i.cu_seqlens, i.cu_seqlens, i.max_seqlen, i.max_seqlen, causal=True,
                             dtype=torch.float32)
    ref.backward(i.do.float())
    exact = (ref, None, q.grad, k.grad, v.grad)
    report["cos_vs_fp32"] = {n: cos(a, b) for n, a, b in zip(names, tri, exact) if b is not None}
    report["cos_emulator_vs_fp32"] = {n: cos(a, b) for n, a, b in zip(names, emu, exact) if b is not None}


def graph_replay(report):
    """Capture the whole training call once, replay it on new inputs of the same shapes."""
    case = make_case(WORKLOADS["logu11-16k"], "cuda")
    i = case.inputs
    q, k, v = (x.detach().clone().requires_grad_() for x in (i.q, i.k, i.v))
    do = i.do.clone()

    def step():
        out = triton_attention(q, k, v, i.cu_seqlens, i.cu_seqlens, i.max_seqlen, i.max_seqlen, causal=True)
        return (out, *torch.autograd.grad(out, (q, k, v), do))

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static = step()
    new = make_case(replace(WORKLOADS["logu11-16k"], seed=123), "cuda")
    with torch.no_grad():
        for dst, src in zip((q, k, v, do), (new.inputs.q, new.inputs.k, new.inputs.v, new.inputs.do)):
            dst.copy_(src)
    g.replay()
    torch.cuda.synchronize()
    eager = step()
    report["graph_replay_max_rel"] = max(rel(a, b) for a, b in zip(static, eager))


def sass(report):
    """QGMMA (FP8 wgmma) counts, registers and spills of every compiled variant of the
    attention kernels, keyed by name, warps, stages and cache entry (the tile sweep compiles
    several variants under one name; keyed by name alone, the last one read won)."""
    cache = os.path.expanduser("~/.triton/cache")
    out = {}
    for cubin in glob.glob(f"{cache}/**/*.cubin", recursive=True):
        name = os.path.basename(cubin)[:-6]
        if not re.search("attn|dq|dkdv|quantize", name):
            continue
        meta = {}
        jf = cubin[:-6] + ".json"
        if os.path.exists(jf):
            meta = json.load(open(jf))
        dump = subprocess.run(["cuobjdump", "-sass", cubin], capture_output=True, text=True).stdout
        # "REG:168 STACK:0 SHARED:... LOCAL:..." per function
        res = subprocess.run(["cuobjdump", "-res-usage", cubin], capture_output=True, text=True).stdout
        usage = dict(re.findall(r"(REG|STACK|LOCAL):(\d+)", res))
        key = f"{name} w{meta.get('num_warps')} s{meta.get('num_stages')} {os.path.basename(os.path.dirname(cubin))[:8]}"
        out[key] = {"QGMMA": dump.count("QGMMA"), "HGMMA": dump.count("HGMMA"), "HMMA": dump.count("HMMA"),
                     "LDL/STL": dump.count("LDL") + dump.count("STL"),
                     "regs": int(usage.get("REG", -1)), "stack_bytes": int(usage.get("STACK", -1)),
                     "warps": meta.get("num_warps"), "stages": meta.get("num_stages")}
    report["sass"] = out


def kernel_only(i, causal, t=None):
    """Closures timing the quantizers, the forward kernel and the backward kernels alone."""
    d = i.q.shape[-1]
    t = t or tiles_for(d)
    cu = i.cu_seqlens

    def quant():  # as ops.py: K and V reuse Q's transposed starts and tile list
        qq = quantize_operand(i.q, cu, 32, d == 128, True)
        kq = quantize_operand(i.k, cu, 32, d == 128, True, qq.cu_seqlens_t, work=qq.work)
        return qq, kq, quantize_operand(i.v, cu, 32, False, True, qq.cu_seqlens_t, work=qq.work)

    qq, kq, vq = quant()
    pv = prefix_v_exponent(vq.exps, cu, cu, i.q.shape[0], causal, (-1, -1))
    kw = dict(causal=causal, window_size=(-1, -1), softmax_scale=d ** -0.5)
    fwd = lambda: attention_forward(qq.codes, qq.exps, kq.codes, kq.exps, vq.codes_t, vq.exps, pv, cu, cu,
                                    vq.cu_seqlens_t, tau=4, sigma=4, scale_block=32, tiles=t, **kw)
    out, lse, m, ro = fwd()
    go = quantize_grad_output(i.do, out, ro, cu, 32, t.bwd_block_m)
    bwd = lambda: attention_backward(qq.codes, qq.codes_t, qq.exps, kq.codes, kq.codes_t, kq.exps, vq.codes, vq.exps,
                                     go.do_codes, go.do_exps, go.dot_codes_t, go.dot_exps, go.delta, m, ro, pv,
                                     cu, cu, qq.cu_seqlens_t, kq.cu_seqlens_t, sigma=4, scale_block=32, tiles=t,
                                     rotate=d == 128, out_dtype=i.q.dtype, **kw)
    qbytes = 3 * i.q.numel() * (2 + 2)  # read bf16, write row-major + transposed fp8
    return fwd, bwd, quant, qbytes


def cuda_ms(fn, calls: int = 5) -> float:
    """GPU time of one call of fn in ms: its kernels' CUDA time summed (``kernel_times``). Host
    work between launches does not count, which a wall clock of eager calls would include:
    for the quantizers and the smaller workloads that is most of it."""
    return sum(ms for ms, _ in kernel_times(fn, calls).values())


def speed(report, names):
    """Kernel-only forward, backward and Q/K/V quantizer: GPU time (``cuda_ms``); the training
    call, flamia's and FA2's: eager wall medians (do_bench), as a user's eager step sees them."""
    rows = []
    for name in names:
        w = WORKLOADS[name]
        case = make_case(w, "cuda")
        i = case.inputs
        fwd, bwd, quant, qbytes = kernel_only(i, w.causal)
        ms = lambda f: do_bench(f, warmup=25, rep=100, return_mode="median")
        attn = lambda q, k, v: triton_attention(q, k, v, i.cu_seqlens, i.cu_seqlens, i.max_seqlen, i.max_seqlen,
                                                causal=w.causal)
        r = {"workload": name,
             "fwd_kernel": cuda_ms(fwd), "bwd_kernel": cuda_ms(bwd), "quant_qkv": cuda_ms(quant),
             "train": ms(autograd_job(attn, i, "train")),
             "fa2_fwd": ms(fa2_job(case, "fwd")), "fa2_bwd": ms(fa2_job(case, "bwd")),
             "fa2_train": ms(fa2_job(case, "train"))}
        r["quant_TBps"] = qbytes / r["quant_qkv"] / 1e9
        for mode, key in (("fwd", "fwd_kernel"), ("bwd", "bwd_kernel"), ("train", "train"),
                          ("fwd", "fa2_fwd"), ("bwd", "fa2_bwd"), ("train", "fa2_train")):
            r[key + "_tflops"] = tflops_per_s(w, mode, r[key])
        rows.append(r)
        print(json.dumps(r), flush=True)
    report["speed"] = rows


# One change at a time from configs.py's tiles (the Gluon forward, dQ and dK/dV; one warpgroup per backward
# program); each entry must stay a valid AttnTiles, e.g. dq_atomic needs dq_block_n == bwd_block_n.
TUNE = [dict(), dict(fwd_gluon=False), dict(fwd_block_n=64), dict(fwd_stages=2), dict(fwd_stages=4),
        dict(bwd_block_m=32, bwd_stages=4), dict(dkdv_gluon=False), dict(bwd_block_m=32, bwd_stages=4, dkdv_gluon=False),
        dict(bwd_block_n=128, bwd_warps=8, dkdv_gluon=False), dict(bwd_stages=3),
        dict(dq_gluon=False), dict(dq_block_m=128, dq_warps=8, dq_gluon=False), dict(dq_block_n=128), dict(dq_stages=2),
        dict(dq_atomic=True, dkdv_gluon=False)]


def tune(report, only="", name="eq8x8k"):
    """Kernel-only times of a few tile configurations (numerics-bearing sizes included: the
    emulator follows whatever configs.py says). only="bwd" keeps the baseline and the
    configurations that change no forward tile."""
    w = WORKLOADS[name]
    i = make_case(w, "cuda").inputs
    rows = []
    for cfg in TUNE:
        if only == "bwd" and any(k.startswith("fwd") for k in cfg):
            continue
        t = replace(tiles_for(w.head_dim), **cfg)
        fwd, bwd, _, _ = kernel_only(i, w.causal, t)
        ms = lambda f: do_bench(f, warmup=10, rep=40, return_mode="median")
        row = {"cfg": cfg, "fwd_tflops": tflops_per_s(w, "fwd", ms(fwd)), "bwd_tflops": tflops_per_s(w, "bwd", ms(bwd))}
        rows.append(row)
        print("tune", json.dumps(row), flush=True)
    report["tune"] = rows


def profile(report, names=("eq8x8k", "skew8k+224x256", "logu11-16k")):
    """Where the training call's time goes: CUDA time per kernel (torch.profiler) over three
    training calls: the total, the number of launches, the ten largest entries and their share."""
    out = {}
    for name in names:
        w = WORKLOADS[name]
        i = make_case(w, "cuda").inputs
        attn = lambda q, k, v: triton_attention(q, k, v, i.cu_seqlens, i.cu_seqlens, i.max_seqlen, i.max_seqlen,
                                                causal=w.causal)
        times = kernel_times(autograd_job(attn, i, "train"), 3)
        total = sum(ms for ms, _ in times.values())
        top = sorted(times.items(), key=lambda kv: -kv[1][0])[:10]
        out[name] = {"cuda_ms_per_call": total, "launches_per_call": sum(n for _, n in times.values()),
                     "top": [{"kernel": kernel[:80], "ms_per_call": ms, "share": ms / total}
                             for kernel, (ms, _) in top]}
        print("profile", name, json.dumps(out[name]), flush=True)
    report["profile"] = out


def run_once(name, cfg):
    """The quantizers, the forward and the backward kernels of one workload, twice."""
    w = WORKLOADS[name]
    i = make_case(w, "cuda").inputs
    fwd, bwd, quant, _ = kernel_only(i, w.causal, replace(tiles_for(w.head_dim), **cfg))
    for _ in range(2):
        quant(), fwd(), bwd()
    torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--workloads", default=",".join(GROUPS["causal"]))
    ap.add_argument("--skip", default="", help="comma list of: correctness,graph,speed,profile,tune,sass")
    ap.add_argument("--tune", default="", choices=("", "bwd"), help="bwd: only the backward's configurations")
    ap.add_argument("--once", metavar="WORKLOAD", help="run each kernel twice for a profiler, nothing else")
    ap.add_argument("--tiles", default="{}", help="with --once: AttnTiles fields to change, as JSON")
    args = ap.parse_args()
    if args.once:
        return run_once(args.once, json.loads(args.tiles))
    skip = set(args.skip.split(","))
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    for key, fn in (("correctness", correctness), ("graph", graph_replay)):
        if key not in skip:
            t0 = time.time()
            fn(report)
            print(key, f"{time.time() - t0:.1f}s", json.dumps({k: v for k, v in report.items()
                                                             if k not in ("device", "torch", "triton", "date")}),
                  flush=True)
    if "speed" not in skip:
        speed(report, args.workloads.split(","))
    if "profile" not in skip:
        profile(report)
    if "tune" not in skip:
        tune(report, args.tune)
    if "sass" not in skip:
        sass(report)
    os.makedirs(args.out, exist_ok=True)
    json.dump(report, open(os.path.join(args.out, "kernel_check.json"), "w"), indent=1)
    print("\nKernel-only fwd, bwd and quant: GPU time (torch.profiler); train: eager wall (do_bench).")
    print("| workload | fwd TF/s | bwd TF/s | train TF/s | FA2 train TF/s | speedup | quant TB/s |")
    print("|---|---|---|---|---|---|---|")
    for r in report.get("speed", []):
        print(f"| {r['workload']} | {r['fwd_kernel_tflops']:.0f} | {r['bwd_kernel_tflops']:.0f} | "
              f"{r['train_tflops']:.0f} | {r['fa2_train_tflops']:.0f} | {r['fa2_train'] / r['train']:.2f} | "
              f"{r['quant_TBps']:.2f} |")
    for k, v in report.get("sass", {}).items():
        print(k[:40], v)


if __name__ == "__main__":
    sys.exit(main())
