"""Accuracy of one training call against exact attention (paper Table 4).

Both sides see the same bf16 inputs and the same upstream gradient dO; the reference is
``flamia.exact_attention`` in float64 (or float32). For O, dQ, dK and dV the report gives the
cosine similarity and the relative error ||a - b|| / ||b||, both computed in float64; "n/a"
for the gradients of a forward-only callable (``flamia.workload.ForwardOnly``).
"""
from dataclasses import dataclass

import torch

from .recipes import Recipe
from .workload import (Attention, PackedInputs, TrainingCall, as_attention, exact_reference,
                       make_packed_inputs, recipe_label, training_call)

COMPARED = ("O", "dQ", "dK", "dV")
Scores = dict[str, "float | None"]  # quantity -> score, None where the call did not produce it

# Paper Table 4, causal column: cosine of O / dQ to FP32 (4 x 4096 tokens, 16 heads, d=128, B200).
PAPER_TABLE4 = {"mxfp8": (0.9988, 0.9979), "nvfp4": (0.9920, 0.9906), "fp4": (0.9810, 0.9456)}

# The acceptance workload: three packed documents, one of a single token.
DEFAULT_LENGTHS = (1000, 333, 1)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine similarity of two tensors flattened, in float64."""
    a, b = a.double().flatten(), b.double().flatten()
    return float(a @ b / (a.norm() * b.norm()))


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64 (b is the reference)."""
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


@dataclass(frozen=True)
class AccuracyReport:
    """Cosine and relative error per quantity ("O", "dQ", "dK", "dV") of one attention
    callable against the exact reference on one workload (None: not produced)."""

    label: str
    lengths: tuple[int, ...]
    heads: int
    head_dim: int
    causal: bool
    outliers: int
    cos: Scores
    rel: Scores

    def format(self, header: bool = True) -> str:
        """One table row (and the header), with the paper's Table 4 cosines beside ours."""
        paper = PAPER_TABLE4.get(self.label) if self.causal else None
        paper_txt = f"{paper[0]:.4f} / {paper[1]:.4f}" if paper else "-"
        row = ("".join(_cell(self.cos[n], ".5f") for n in COMPARED)
               + "".join(_cell(self.rel[n], ".2e") for n in COMPARED))
        lines = [f"{self.label:<14}{row}   {paper_txt}"]
        if header:
            lines.insert(0, f"{'recipe':<14}" + "".join(f"{'cos ' + n:>9}" for n in COMPARED)
                         + "".join(f"{'rel ' + n:>9}" for n in COMPARED) + "   paper cos O / dQ")
        return "\n".join(lines)

    def describe(self) -> str:
        """The workload in words (the paper's numbers are from 4 x 4096 tokens on a B200)."""
        mask = "causal" if self.causal else "non-causal"
        outliers = f", {self.outliers} outlier channels per K/V head" if self.outliers else ""
        return (f"documents {list(self.lengths)}, {self.heads} heads, d={self.head_dim}, {mask}{outliers}; "
                "reference: exact attention in float64 on the same bf16 inputs and dO")


def _cell(value: "float | None", spec: str) -> str:
    return f"{'n/a' if value is None else format(value, spec):>9}"


def compare(result: TrainingCall, reference: TrainingCall) -> tuple[Scores, Scores]:
    """(cosine, relative error) per compared quantity; None where ``result`` lacks it."""
    got, ref = result.by_name(), reference.by_name()

    def scores(metric) -> Scores:
        return {n: None if got[n] is None else metric(got[n], ref[n]) for n in COMPARED}

    return scores(cosine), scores(relative_error)


def report(label: str, inputs: PackedInputs, result: TrainingCall, reference: TrainingCall,
           causal: bool = True, outliers: int = 0) -> AccuracyReport:
    """The report of a training call ``result`` on ``inputs`` against the exact ``reference``
    call on the same inputs; ``outliers`` only labels the report."""
    cos, rel = compare(result, reference)
    return AccuracyReport(label, inputs.lengths, inputs.q.shape[1], inputs.q.shape[2], causal, outliers, cos, rel)


def measure(attn: "str | Recipe | Attention", inputs: PackedInputs, causal: bool = True,
            backend: str | None = None, reference: TrainingCall | None = None,
            outliers: int = 0) -> AccuracyReport:
    """Accuracy of ``attn`` (a recipe or an attention callable) on ``inputs``. Pass the
    exact ``reference`` call when comparing several recipes on the same inputs (it is
    computed in float64 otherwise)."""
    if reference is None:
        reference = training_call(exact_reference(), inputs, causal)
    result = training_call(as_attention(attn, backend), inputs, causal)
    return report(recipe_label(attn), inputs, result, reference, causal, outliers)


def accuracy(recipe: "str | Recipe | Attention" = "mxfp8", lengths=DEFAULT_LENGTHS, heads: int = 16,
             head_dim: int = 128, causal: bool = True, outliers: int = 0, seed: int = 0,
             backend: str | None = None, device: "str | torch.device" = "cpu") -> AccuracyReport:
    """Table 4 for one recipe: random normal bf16 inputs (``outliers`` > 0 adds that many
    outlier channels per K/V head, see ``flamia.workload.make_packed_inputs``)."""
    inputs = make_packed_inputs(lengths, heads, heads, head_dim, torch.bfloat16, outliers, seed, device)
    return measure(recipe, inputs, causal, backend, outliers=outliers)
