"""Interleaved kernel-only A/B with kernels swapped per config: python ab5.py MODE CONFIGS_JSON WORKLOADS ROUNDS.
MODE fwd or bwd (the launchers of kernel_check.kernel_only). CONFIGS_JSON: [{"name", "modules": [[NAME, FILE], ...],
"swap": [[MODULE, ATTR, FILE], ...], "tiles": {...}}]: FILE of "modules" becomes flamia.kernels.NAME (for the swapped
files' relative imports of older helpers): for that config, flamia.kernels.MODULE.ATTR is FILE's ATTR (FILE loaded as a module of flamia.kernels,
so its relative imports resolve). Per round each config's launcher runs 3 times under torch.profiler; prints per
(workload, config) the median over rounds of the CUDA ms of each kernel."""
import collections, dataclasses, importlib, importlib.util, json, os, statistics, sys
sys.path[:0] = [os.getcwd(), os.getcwd() + "/benchmarks"]
import torch
from torch.profiler import ProfilerActivity, profile
from kernel_check import kernel_only
from flamia.bench.workloads import WORKLOADS, make_case
from flamia.kernels.configs import tiles_for
mode, cfgs, names, rounds = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3].split(","), int(sys.argv[4])


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def bindings(c):
    for name, path in c.get("modules", []):
        load("flamia.kernels." + name, path)
    out = []
    for mod_name, attr, path in c.get("swap", []):
        mod = load(f"flamia.kernels._ab_{c['name']}_{attr}", path)
        out.append((importlib.import_module("flamia.kernels." + mod_name), attr, getattr(mod, attr)))
    return out


SWAPS = [bindings(c) for c in cfgs]
SHIPPED = {(m, a): getattr(m, a) for s in SWAPS for m, a, _ in s}


def apply(swaps):
    for (m, a), k in SHIPPED.items():
        setattr(m, a, k)
    for m, a, k in swaps:
        setattr(m, a, k)


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


for name in names:
    w = WORKLOADS[name]
    i = make_case(w, "cuda").inputs
    fns = []
    for c, s in zip(cfgs, SWAPS):
        apply(s)
        fwd, bwd, _, _ = kernel_only(i, w.causal, dataclasses.replace(tiles_for(w.head_dim), **c.get("tiles", {})))
        fn = fwd if mode == "fwd" else bwd
        fns.append(fn)
        fn(); fn()
    got = [collections.defaultdict(list) for _ in cfgs]
    for r in range(rounds):
        for s, fn, g in zip(SWAPS, fns, got):
            apply(s)
            for k, v in per_kernel(fn).items():
                g[k].append(v)
    for c, g in zip(cfgs, got):
        med = {k: round(statistics.median(v), 3) for k, v in sorted(g.items(), key=lambda kv: -sum(kv[1]))[:3]}
        print(json.dumps({"workload": name, "cfg": c["name"], "median_ms": med, "total_ms": round(sum(med.values()), 3),
                          "spread": {k: round(max(v) - min(v), 3) for k, v in g.items() if k in med}}), flush=True)
