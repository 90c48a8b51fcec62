"""``flamia demo``: every recipe's training call on packed documents, its accuracy against
exact attention, its leakage-probe verdict, and (on a GPU) the speed of the MXFP8 Triton
training call against BF16 FlashAttention-2.

The workload is small enough for a 2-core CPU (the emulator, about a minute); on a GPU the
same recipes run through ``flamia.flash_attn_varlen_func``'s default backend (Triton for
mxfp8, the emulator otherwise).
"""
import time

import torch

from .accuracy import PAPER_TABLE4, report
from .probe import probe
from .workload import as_attention, exact_reference, make_packed_inputs, training_call

DEMO_RECIPES = ("mxfp8", "nvfp4", "fp4", "bf16")
# Four packed documents of odd lengths (one of a single token), 16 heads, d=128, causal.
DEMO_LENGTHS = (160, 67, 29, 1)
DEMO_HEADS = 16
# The probe runs on the first heads of the same documents (each head is probed alike; fewer
# keep the CPU demo short), with cuts in document 0 on a block boundary (64) and off one
# (141, in the second key tile).
PROBE_HEADS = 4
DEMO_CUTS = (64, 141)
# The speed comparison: a benchmark workload of 11 packed documents (16384 tokens) and the
# providers compared on it (flamia.bench.providers keys).
SPEED_WORKLOAD = "logu11-16k"
SPEED_PROVIDERS = ("flamia:mxfp8", "fa2:bf16")


def accuracy_and_verdicts(device: torch.device, out=print) -> None:
    """For each recipe: one forward + backward on the demo workload, its cosines to the
    float64 reference, and the leakage probe's verdict."""
    inputs = make_packed_inputs(DEMO_LENGTHS, DEMO_HEADS, device=device)
    out(f"workload: {len(DEMO_LENGTHS)} packed documents of lengths {list(DEMO_LENGTHS)}, {DEMO_HEADS} heads, "
        f"d=128, causal, bf16, on {device}")
    out("accuracy: cosine / relative error to exact attention in float64 on the same inputs and dO")
    reference = training_call(exact_reference(), inputs)
    for i, recipe in enumerate(DEMO_RECIPES):
        start = time.perf_counter()
        result = training_call(as_attention(recipe), inputs)
        out(report(recipe, inputs, result, reference).format(header=i == 0))
        probed = probe(recipe, inputs.first_heads(PROBE_HEADS), cuts=DEMO_CUTS)
        out(f"{'':<14}leakage probe (heads 0-{PROBE_HEADS - 1}, cuts {', '.join(map(str, DEMO_CUTS))}; "
            f"document {probed.documents.doc} x{probed.documents.factor:g}): {probed.verdict}"
            f"   [{time.perf_counter() - start:.1f} s]")
    paper = "; ".join(f"{name} {o:.4f} / {dq:.4f}" for name, (o, dq) in PAPER_TABLE4.items())
    out(f"paper Table 4 (causal, 4 x 4096 tokens, B200), cos O / dQ: {paper}")


def speed(out=print) -> None:
    """Training-call time (forward + backward) of the MXFP8 Triton kernels against BF16
    FlashAttention-2 (aten varlen) on one packed workload, with the benchmark's timing
    protocol (``flamia.bench``), eager rather than CUDA-graph replays."""
    # Imported here: the benchmark harness (and its peers' probing) only matters on a GPU.
    from .bench.providers import registry, select_providers
    from .bench.run import time_row
    from .bench.timing import Protocol, cuda_clock
    from .bench.workloads import WORKLOADS, make_case

    case = make_case(WORKLOADS[SPEED_WORKLOAD], "cuda")
    workload = case.workload
    providers = select_providers(registry(), ",".join(SPEED_PROVIDERS))
    records = {r.provider: r for r in time_row(case, "train", providers, "cuda", Protocol(graphs=False), cuda_clock)}
    out(f"speed: training call (forward + backward), eager (no CUDA graph), {workload.name}: "
        f"{len(workload.lengths)} packed documents, {workload.total} tokens, {workload.heads_q} heads, "
        f"d={workload.head_dim}, causal, {torch.cuda.get_device_name()}")
    for r in records.values():
        out(f"  {r.label:<28}" + (f"{r.ms:8.2f} ms {r.tflops:7.0f} TFLOP/s" if r.ms is not None else f"n/a: {r.why}"))
    mx, bf = records["flamia"].ms, records["fa2"].ms
    if mx is not None and bf is not None:
        out(f"  MXFP8 speedup over BF16: {bf / mx:.2f}x")


def run(device: "str | None" = None, with_speed: bool = True, out=print) -> None:
    """The whole demo on ``device`` (default: CUDA when present, else the CPU)."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    start = time.perf_counter()
    accuracy_and_verdicts(device, out)
    if device.type != "cuda":
        out("speed: skipped (needs a CUDA GPU; on the CPU every recipe runs in the emulator)")
    elif with_speed:
        speed(out)
    out(f"demo finished in {time.perf_counter() - start:.1f} s")
