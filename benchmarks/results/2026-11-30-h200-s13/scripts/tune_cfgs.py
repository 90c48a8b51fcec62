"""Session 13: one change at a time from the d=64 tiles (configs.py: 'd=64 is untuned and shares
these'). Kernel-only CUDA ms per kernel (torch.profiler), interleaved rounds, medians.
Usage: PYTHONPATH=. python3 scratch/calls/tune_cfgs.py WORKLOADS ROUNDS CFGS_JSON (changes from configs.py)"""
import json, sys, statistics
from dataclasses import replace
import torch
sys.path.insert(0, "benchmarks")
from kernel_check import kernel_only, _cuda_events
from flamia.bench.workloads import WORKLOADS, make_case
from flamia.kernels.configs import tiles_for

CFGS = [{}] + json.loads(sys.argv[3])


def per_kernel(fn, calls=5):
    ev = _cuda_events(fn, calls)
    out = {}
    for e in ev:
        key = "dkdv" if "dkdv" in e.key else "dq" if "dq" in e.key else "fwd" if "fwd" in e.key else "other"
        out[key] = out.get(key, 0) + e.self_device_time_total / calls / 1e3
    return out


names = sys.argv[1].split(",")
rounds = int(sys.argv[2])
for name in names:
    w = WORKLOADS[name]
    i = make_case(w, "cuda").inputs
    jobs = []
    for cfg in CFGS:
        t = replace(tiles_for(w.head_dim), **cfg)
        fwd, bwd, _, _ = kernel_only(i, w.causal, t)
        jobs.append((cfg, fwd, bwd))
    res = {json.dumps(c): {} for c, _, _ in jobs}
    base = [x.clone() for x in jobs[0][2]()]
    for cfg, _, bwd in jobs[1:]:
        if not any(k.startswith(("fwd_block", "dq_block")) for k in cfg):
            same = all(torch.equal(a, b) for a, b in zip(base, bwd()))
            print("bitwise", name, json.dumps(cfg), same, flush=True)
    for r in range(rounds):
        for cfg, fwd, bwd in jobs:
            k = json.dumps(cfg)
            f = per_kernel(fwd)
            b = per_kernel(bwd)
            for kk, vv in (("fwd", f.get("fwd", 0)), ("dkdv", b.get("dkdv", 0)), ("dq", b.get("dq", 0)),
                           ("bwd_total", sum(b.values()))):
                res[k].setdefault(kk, []).append(vv)
    print(f"## {name}")
    print("| cfg | fwd | dkdv | dq | bwd total |")
    for k, v in res.items():
        med = {kk: statistics.median(vv) for kk, vv in v.items()}
        print(f"| {k} | {med['fwd']:.3f} | {med['dkdv']:.3f} | {med['dq']:.3f} | {med['bwd_total']:.3f} |", flush=True)
        print("json", json.dumps({"workload": name, "cfg": json.loads(k), **med}), flush=True)
