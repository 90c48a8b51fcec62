"""Kernel-only A/B: python ab.py ROOT TAG CONFIGS_JSON WORKLOADS -> one JSON line per (config, workload):
median ms of the forward and backward launchers (do_bench) and CUDA ms per kernel (torch.profiler, 3 calls)."""
import json, sys, dataclasses, collections
root = sys.argv[1]
sys.path[:0] = [root, root + "/benchmarks"]
import torch
from torch.profiler import ProfilerActivity, profile
from triton.testing import do_bench
import flamia
assert flamia.__file__.startswith(root), flamia.__file__
from kernel_check import kernel_only
from flamia.bench.workloads import WORKLOADS, make_case
from flamia.bench.flops import tflops_per_s
from flamia.kernels.configs import tiles_for
tag, cfgs, names = sys.argv[2], json.loads(sys.argv[3]), sys.argv[4].split(",")
for name in names:
    w = WORKLOADS[name]
    i = make_case(w, "cuda").inputs
    for cfg in cfgs:
        t = dataclasses.replace(tiles_for(w.head_dim), **cfg)
        fwd, bwd, _, _ = kernel_only(i, w.causal, t)
        ms = lambda f: do_bench(f, warmup=10, rep=60, return_mode="median")
        f, b = ms(fwd), ms(bwd)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                fwd(); bwd()
            torch.cuda.synchronize()
        per = collections.Counter()
        for e in prof.key_averages():
            if e.self_device_time_total > 0:
                per[e.key[:40]] += e.self_device_time_total / 3e3
        print(json.dumps({"tag": tag, "workload": name, "cfg": cfg, "fwd_ms": f, "bwd_ms": b,
                          "fwd_tflops": tflops_per_s(w, "fwd", f), "bwd_tflops": tflops_per_s(w, "bwd", b),
                          "kernels_ms": {k: round(v, 4) for k, v in per.most_common(8)}}), flush=True)
