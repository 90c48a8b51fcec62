"""A tiny driver for compute-sanitizer: three training calls (forward and backward) of the MXFP8,
mixed NVFP4 or all-4-bit Triton path per case, the first recording the launches and the others replaying them
(flamia/kernels/replay.py), on documents (100, 0, 1, 67, 33) (an empty and a one-token document among them),
GQA 4/2, bf16, so that every kernel family of a training call (aligned starts, tile lists,
the Q/K/V quantizers with and without the rotation, key records, PV prefix, the Gluon
forward, the dO quantizer, query records, the Gluon dQ and dK/dV, and the all-4-bit route's
Triton kernels) launches a few times on small tensors and the sanitizer stays fast.

    PYTHONPATH=. python3 benchmarks/sanitize_case.py [--cases default|all] [--warm]
    compute-sanitizer --tool memcheck python3 benchmarks/sanitize_case.py

The default cases cover each head dim (64: plain quantizer; 128: the rotated one), each mask
(causal; a two-sided window, non-causal) and each MXFP8 recipe (mxfp8, 32-token scales;
mxfp8-exact, per-token scales) twice, and the mixed NVFP4 route (bf16 score codes, 4-bit P)
and the all-4-bit route (per-key diagonal operands, E2M1 G from hashed random words, one seed for
all three calls) once per head dim; ``--cases all`` runs all twenty combinations.
``--warm`` runs every case once more first (compiles outside what a sanitizer should see,
when the Triton cache is cold). Prints one line per case and exits non-zero if an output or
gradient is not finite or has the wrong shape (benchmarks/gpu_gate.sh runs it under each
sanitizer tool).
"""
import argparse
import itertools
import sys
import time

import torch

LENGTHS = (100, 0, 1, 67, 33)
HEADS_Q, HEADS_KV = 4, 2
MASKS = {"causal": (True, (-1, -1)), "window": (False, (48, 16))}
DEFAULT_CASES = [(128, "causal", "mxfp8"), (64, "causal", "mxfp8-exact"),
                 (128, "window", "mxfp8-exact"), (64, "window", "mxfp8"),
                 (128, "causal", "nvfp4"), (64, "window", "nvfp4-exact"),
                 (128, "window", "fp4"), (64, "causal", "fp4")]
ALL_CASES = list(itertools.product((128, 64), MASKS, ("mxfp8", "mxfp8-exact", "nvfp4", "nvfp4-exact", "fp4")))


def run_case(d: int, mask: str, recipe: str, seed: int = 0) -> list[str]:
    """Three training calls on the Triton backend; the problems found (empty if none),
    replayed results that differ from the first call's among them."""
    import flamia

    causal, window = MASKS[mask]
    g = torch.Generator().manual_seed(seed)
    total = sum(LENGTHS)
    q = torch.randn(total, HEADS_Q, d, generator=g).to("cuda", torch.bfloat16).requires_grad_()
    k = torch.randn(total, HEADS_KV, d, generator=g).to("cuda", torch.bfloat16).requires_grad_()
    v = torch.randn(total, HEADS_KV, d, generator=g).to("cuda", torch.bfloat16).requires_grad_()
    do = torch.randn(total, HEADS_Q, d, generator=g).to("cuda", torch.bfloat16)
    cu = torch.tensor([0, *itertools.accumulate(LENGTHS)], dtype=torch.int32, device="cuda")
    calls = []
    for _ in range(3):
        out, lse = flamia.flash_attn_varlen_func(q, k, v, cu, cu, max(LENGTHS), max(LENGTHS), causal=causal,
                                                 window_size=window, recipe=recipe, backend="triton",
                                                 return_lse=True, seed=seed)
        calls.append((out, lse, *torch.autograd.grad(out, (q, k, v), do)))
    torch.cuda.synchronize()
    problems = [f"call {i}: {name} differs from call 0" for i, call in enumerate(calls[1:], 1)
                for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), call, calls[0]) if not torch.equal(a, b)]
    out, lse, dq, dk, dv = calls[-1]
    for name, x, like in (("out", out, q), ("dq", dq, q), ("dk", dk, k), ("dv", dv, v)):
        if x.shape != like.shape:
            problems.append(f"{name} shape {tuple(x.shape)}")
        if not torch.isfinite(x).all():
            problems.append(f"{name} not finite")
    # lse is +inf exactly on rows that see no key; every row here sees at least itself
    # (causal) or its window, so all of lse is finite.
    if lse.shape != (HEADS_Q, total) or not torch.isfinite(lse).all():
        problems.append("lse not finite or misshaped")
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", choices=("default", "all"), default="default")
    ap.add_argument("--warm", action="store_true", help="run every case once before the measured pass")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("sanitize_case: needs CUDA", file=sys.stderr)
        return 2
    cases = DEFAULT_CASES if args.cases == "default" else ALL_CASES
    if args.warm:
        for case in cases:
            run_case(*case)
    failed = 0
    for d, mask, recipe in cases:
        start = time.perf_counter()
        problems = run_case(d, mask, recipe)
        failed += bool(problems)
        print(f"sanitize_case d={d} {mask} {recipe}: {'; '.join(problems) or 'ok'} "
              f"({time.perf_counter() - start:.1f} s)", flush=True)
    print(f"sanitize_case: {len(cases) - failed} of {len(cases)} cases ok")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
