"""How each recipe's gradients follow exact attention as the attention logits grow.

A trained model's attention sharpens: some heads put nearly all of a row's weight on one key,
with logits tens of units apart. Random normal inputs (paper Table 4, `flamia accuracy`) keep
the logits near unit spread. Here q and k are both multiplied by `sharp`, so the logits
q.k / sqrt(d) spread `sharp`^2 times wider, and each recipe's training call (the emulator,
bit for bit the kernels' numerics) is compared with exact attention in float64.

A second table finds the operand whose rounding costs the accuracy: one causal sequence of
512 tokens in float64 with a single operand rounded to E4M3 (Q and K, the scores' operands;
P; dS; dO), each row scaled by a power of two to E4M3's range, everything else exact.

    python experiments/logit_scale.py        # CPU, about 10 s

Inputs: documents (300, 150, 62), 4 heads, d=64 (the paper profile's head size), seed 1.
"""
import dataclasses
import math

import torch

from flamia.accuracy import measure
from flamia.recipes import Recipe
from flamia.workload import exact_reference, make_packed_inputs, training_call

RECIPES = {"bf16": "bf16", "mxfp8": "mxfp8", "mxfp8 bf16_scores": Recipe("mxfp8", bf16_scores=True),
           "nvfp4": "nvfp4", "nvfp4 bf16_scores": Recipe("nvfp4", bf16_scores=True), "fp4": "fp4"}
SHARPNESS = (1.0, 2.0, 3.0, 4.0)


def _e4m3_rows(x: torch.Tensor) -> torch.Tensor:
    """x [N, C] float64 rounded to E4M3 with a power-of-two scale per row."""
    scale = torch.exp2(torch.floor(torch.log2(448 / x.abs().amax(-1, keepdim=True).clamp_min(1e-30))))
    return (x * scale).to(torch.float8_e4m3fn).double() / scale


def dq_with_one_rounding(sharp: float, rounded: str, tokens: int = 512, head_dim: int = 64) -> float:
    """Cosine of dQ with only ``rounded`` ("QK", "P", "dS" or "dO") in E4M3 to exact dQ."""
    gen = torch.Generator().manual_seed(1)
    q, k, v, do = (torch.randn(tokens, head_dim, generator=gen, dtype=torch.float64) for _ in range(4))
    q, k = q * sharp, k * sharp
    future = torch.ones(tokens, tokens, dtype=torch.bool).triu(1)

    def dq(rounded: str) -> torch.Tensor:
        qr, kr = (_e4m3_rows(q), _e4m3_rows(k)) if rounded == "QK" else (q, k)
        p = (qr @ kr.T / math.sqrt(head_dim)).masked_fill(future, -math.inf).softmax(-1)  # [T, T]
        if rounded == "P":
            p = p.to(torch.float8_e4m3fn).double()
        dor = _e4m3_rows(do) if rounded == "dO" else do
        ds = p * (dor @ v.T - (dor * (p @ v)).sum(-1, keepdim=True))  # [T, T]
        if rounded == "dS":
            ds = _e4m3_rows(ds)
        return ds @ kr / math.sqrt(head_dim)

    got, want = dq(rounded).flatten(), dq("").flatten()
    return float(got @ want / (got.norm() * want.norm()))


def main() -> None:
    base = make_packed_inputs((300, 150, 62), heads_q=4, head_dim=64, seed=1)
    print("cosine to exact attention (float64) of O, dQ, dK, dV; logit spread = sharp^2")
    for sharp in SHARPNESS:
        inputs = dataclasses.replace(base, q=(base.q.float() * sharp).bfloat16(),
                                     k=(base.k.float() * sharp).bfloat16())
        reference = training_call(exact_reference(), inputs, True)
        for label, recipe in RECIPES.items():
            cos = measure(recipe, inputs, backend="reference", reference=reference).cos
            print(f"sharp {sharp:3.1f}  {label:17s}  " + "  ".join(f"{name} {cos[name]:.5f}" for name in cos),
                  flush=True)
    print("\ncosine of dQ to exact with one operand rounded to E4M3 (float64 otherwise)")
    for sharp in SHARPNESS:
        print(f"sharp {sharp:3.1f}  " + "  ".join(f"{name} {dq_with_one_rounding(sharp, name):.5f}"
                                               for name in ("QK", "P", "dS", "dO")))


if __name__ == "__main__":
    main()
