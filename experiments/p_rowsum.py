"""How far the dequantized probabilities of each recipe are from summing to one.

O divides P^ V^ by l, the sum of the *unquantized* p (NUMERICS.md 3, step 5), and the
backward uses dS = Pd (dP - D) with D = rowsum(dO * O). When a row's dequantized weights
Pd sum to 1 - eps, rowsum(dS) = eps * D instead of 0: the scores' gradient is no longer
invariant to a shift of the whole row, a systematic term that E4M3 P keeps near zero and
4-bit P (small probabilities flush to zero) does not. With V = 1 every output channel of
a row is exactly that sum, so one forward measures it.

    python experiments/p_rowsum.py        # CPU, about a minute; prints one line per case

Inputs: documents (512, 300, 77), 4 heads, d=64, random normal q, k (q scaled by `sharp`
to make attention peakier, as trained models' is), v = 1.
"""
import torch

from flamia.workload import as_attention, make_packed_inputs

RECIPES = ("mxfp8", "nvfp4", "fp4")


def row_sums(recipe: str, sharp: float) -> torch.Tensor:
    """sum_j Pd_ij for every (row, head) of the workload, fp32 [T, H]."""
    i = make_packed_inputs((512, 300, 77), heads_q=4, head_dim=64, seed=1)
    q = (i.q.float() * sharp).bfloat16()
    out, _ = as_attention(recipe, "reference")(q, i.k, torch.ones_like(i.v), i.cu_seqlens, i.cu_seqlens,
                                               i.max_seqlen, i.max_seqlen, True)
    return out.float()[..., 0]


def main() -> None:
    print(f"{'recipe':<8}{'sharp':>6}{'mean(sum Pd - 1)':>18}{'min':>9}{'max':>9}")
    for sharp in (1.0, 2.0, 4.0):
        for recipe in RECIPES:
            dev = row_sums(recipe, sharp) - 1
            print(f"{recipe:<8}{sharp:>6g}{dev.mean().item():>+18.4f}{dev.min().item():>+9.4f}{dev.max().item():>+9.4f}")


if __name__ == "__main__":
    main()
