"""python fwd_only.py WORKLOAD [CFG_JSON]: the forward launcher of kernel_check.kernel_only, 4 times (for ncu)."""
import dataclasses, json, sys
sys.path[:0] = [".", "benchmarks"]
import torch
from kernel_check import kernel_only
from flamia.bench.workloads import WORKLOADS, make_case
from flamia.kernels.configs import tiles_for
w = WORKLOADS[sys.argv[1]]
cfg = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
fwd, _, _, _ = kernel_only(make_case(w, "cuda").inputs, w.causal, dataclasses.replace(tiles_for(w.head_dim), **cfg))
for _ in range(4):
    fwd()
torch.cuda.synchronize()
