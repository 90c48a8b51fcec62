"""ab2.py with one more config key, "dkdv": a file whose dkdv_gluon_kernel replaces attn_bwd's for that config
(loaded as a module of flamia.kernels, so its relative imports resolve).
Interleaved kernel-only A/B of the backward: python ab3.py CONFIGS_JSON WORKLOADS ROUNDS.
CONFIGS_JSON: [{"name", "env": {...}, "tiles": {...}}]. Per round, each config's backward runs
3 times under torch.profiler; prints per (workload, config) the median over rounds of the CUDA
ms of each kernel, and the spread (max-min) of the dK/dV kernel's."""
import collections, dataclasses, json, os, statistics, sys
sys.path[:0] = [os.getcwd(), os.getcwd() + "/benchmarks"]
import torch
from torch.profiler import ProfilerActivity, profile
from kernel_check import kernel_only
from flamia.bench.workloads import WORKLOADS, make_case
from flamia.kernels.configs import tiles_for
import flamia; print(flamia.__file__, file=sys.stderr)
import importlib.util
from flamia.kernels import attn_bwd
SHIPPED = attn_bwd.dkdv_gluon_kernel


def kernel_of(c):
    if "dkdv" not in c:
        return SHIPPED
    spec = importlib.util.spec_from_file_location("flamia.kernels._ab_" + c["name"], c["dkdv"])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.dkdv_gluon_kernel
cfgs, names, rounds = json.loads(sys.argv[1]), sys.argv[2].split(","), int(sys.argv[3])
what = sys.argv[4] if len(sys.argv) > 4 else "bwd"
KEY = "dkdv" if what == "bwd" else "rotated"


def per_kernel(fn):
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
    per = collections.Counter()
    for e in prof.key_averages():
        if e.self_device_time_total > 0:
            per[e.key[:24]] += e.self_device_time_total / 3e3
    return per


KERNELS = [kernel_of(c) for c in cfgs]
for name in names:
    w = WORKLOADS[name]
    i = make_case(w, "cuda").inputs
    bwds = []
    for c, kern in zip(cfgs, KERNELS):
        attn_bwd.dkdv_gluon_kernel = kern
        os.environ.update(c.get("env", {}))
        _, bwd, quant, _ = kernel_only(i, w.causal, dataclasses.replace(tiles_for(w.head_dim), **c.get("tiles", {})))
        bwd = bwd if what == "bwd" else quant
        bwds.append(bwd)
        bwd(); bwd()
        for k in c.get("env", {}):
            os.environ.pop(k)
    got = [collections.defaultdict(list) for _ in cfgs]
    for r in range(rounds):
        for c, kern, bwd, g in zip(cfgs, KERNELS, bwds, got):
            attn_bwd.dkdv_gluon_kernel = kern
            os.environ.update(c.get("env", {}))
            for k, v in per_kernel(bwd).items():
                g[k].append(v)
            for k in c.get("env", {}):
                os.environ.pop(k)
    for c, g in zip(cfgs, got):
        med = {k: round(statistics.median(v), 3) for k, v in sorted(g.items(), key=lambda kv: -sum(kv[1]))[:3]}
        dk = [v for k, v in g.items() if KEY in k][0]
        print(json.dumps({"workload": name, "cfg": c["name"], "median_ms": med, "total_ms": round(sum(med.values()), 3),
                          "key_spread": round(max(dk) - min(dk), 3)}), flush=True)
