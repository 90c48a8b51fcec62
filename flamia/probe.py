"""Leakage probe for any attention callable (paper Section 4.5 and Table 5; NUMERICS.md 5).

Causal probe: at a cut point t of one document, token t's q, k and v are multiplied (every
head) by a power of two that makes the token at least ``boost`` times the whole tensor's
previous maximum, hence also its 32-token block's maximum. The training call is rerun with
the same dO, and every earlier position of the document is compared with the unperturbed
call, split into positions before t's block and positions inside t's block before t.
Causal attention lets no earlier O, LSE or dQ depend on token t: any change there comes
through a shared quantization scale. dK and dV of an earlier key legitimately depend on the
later query t and are reported for information only.

Cross-document probe: one whole document (q, k, v and dO) is multiplied by 1000, and every
other document's O, LSE, dQ, dK and dV must stay bitwise unchanged.

A change is ``max |new - old| / max |old|`` over a region (float64): 0.0 means bitwise
unchanged, None an empty region or a quantity the callable does not produce (a forward-only
peer has no dQ, dK, dV; some have no LSE); the report prints both as "-" and the verdict
names what was not measured.
"""
import math
from dataclasses import dataclass

import torch

from .recipes import Recipe
from .workload import (Attention, PackedInputs, TrainingCall, as_attention, make_packed_inputs,
                       recipe_label, training_call)

BLOCK = 32  # the token-block size of NUMERICS.md 2: the widest a default scale may reach
QUANTITIES = ("O", "LSE", "dQ", "dK", "dV")
CAUSAL = ("O", "LSE", "dQ")  # may never depend on a later token; dK and dV may

# Default workload: three documents of odd lengths; cuts on (64, 160) and off (45, 141)
# block boundaries, in the first and the second 128-key forward tile of document 0.
PROBE_LENGTHS = (200, 77, 33)
DEFAULT_CUTS = (45, 64, 141, 160)

Changes = dict[str, "float | None"]


@dataclass(frozen=True)
class CausalProbe:
    """Changes after raising token ``cut`` (a position in document ``doc``), whose block
    starts at position ``block_start``; ``farthest`` is the largest distance cut - i of an
    earlier position i whose O, LSE or dQ changed (0: none)."""

    doc: int
    cut: int
    block_start: int
    before_block: Changes
    in_block: Changes
    other_docs: Changes
    farthest: int


@dataclass(frozen=True)
class DocumentProbe:
    """Changes of every other document after document ``doc`` was multiplied by ``factor``."""

    doc: int
    factor: float
    other_docs: Changes


@dataclass(frozen=True)
class ProbeReport:
    """The probes of one attention callable on one workload: one ``CausalProbe`` per cut
    and the cross-document probe (None for a single document). ``verdict`` sums them up."""

    label: str
    lengths: tuple[int, ...]
    boost: float
    causal: tuple[CausalProbe, ...]
    documents: DocumentProbe | None
    unmeasured: tuple[str, ...] = ()  # quantities the callable does not produce

    @property
    def leaks(self) -> list[str]:
        """What depends on what it must not: earlier O/LSE/dQ before the perturbed token's
        block, or anything of another document."""
        found = []
        before = sorted({n for p in self.causal for n in CAUSAL if p.before_block[n]}, key=CAUSAL.index)
        if before:
            far = max(p.farthest for p in self.causal)
            found.append(f"earlier {', '.join(before)} change at distance {far} (before the token's block)")
        cross = [p.other_docs for p in self.causal] + ([self.documents.other_docs] if self.documents else [])
        other = sorted({n for c in cross for n in QUANTITIES if c[n]}, key=QUANTITIES.index)
        if other:
            found.append(f"other documents' {', '.join(other)} change")
        return found

    @property
    def verdict(self) -> str:
        unmeasured = f" ({', '.join(self.unmeasured)} not measured)" if self.unmeasured else ""
        return self._finding() + unmeasured

    def _finding(self) -> str:
        if self.leaks:
            return "LEAKS: " + "; ".join(self.leaks)
        if not self.causal:
            return "isolated: no other document changes"
        far = max((p.farthest for p in self.causal), default=0)
        if far:
            return f"block-local: changes only inside the perturbed block (up to {far} positions back)"
        return "exact: no earlier change"

    def format(self) -> str:
        """The probe as a table of relative changes, then the verdict."""
        head = f"{'cut':>5} {'block':>9}  {'region':<13}" + "".join(f"{n:>9}" for n in QUANTITIES)
        lines = [f"probe of {self.label}: documents {list(self.lengths)}, causal; the perturbed token "
                 f"is raised to >= {self.boost:g}x the tensor's max", head]

        def row(cut, block, region, changes):
            lines.append(f"{cut:>5} {block:>9}  {region:<13}" + "".join(f"{_fmt(changes[n]):>9}" for n in QUANTITIES))

        for p in self.causal:
            block = f"{p.block_start}-{p.block_start + BLOCK - 1}"
            row(p.cut, block, "before block", p.before_block)
            row("", "", "in block", p.in_block)
            row("", "", "other docs", p.other_docs)
        if self.documents:
            row(f"doc {self.documents.doc}", f"x{self.documents.factor:g}", "other docs", self.documents.other_docs)
        lines.append(f"verdict: {self.verdict}")
        return "\n".join(lines)


def _fmt(change: "float | None") -> str:
    return "-" if change is None else "0" if change == 0 else f"{change:.1e}"


def relative_change(new: torch.Tensor, old: torch.Tensor) -> "float | None":
    """max |new - old| / max |old| in float64 (None for empty tensors, 0.0 iff every element
    compares equal; a NaN that appears counts as a change)."""
    if old.numel() == 0:
        return None
    changed = new != old
    if not bool(changed.any()):
        return 0.0
    diff = (new.double() - old.double()).abs()[changed]
    ref = old.double().abs()
    ref = ref[torch.isfinite(ref)]
    largest = float(diff.max()) if not bool(diff.isnan().any()) else math.nan
    return largest / float(ref.max()) if ref.numel() and float(ref.max()) > 0 else math.inf


def region_changes(new: TrainingCall, old: TrainingCall, rows: torch.Tensor) -> Changes:
    """Relative change of every quantity over the packed ``rows`` (bool [T]); None for a
    quantity the calls did not produce."""
    a, b = new.by_name(), old.by_name()
    return {n: None if b[n] is None else relative_change(a[n][rows], b[n][rows]) for n in QUANTITIES}


def raise_token(inputs: PackedInputs, row: int, boost: float) -> PackedInputs:
    """q, k, v with packed row ``row`` multiplied (every head) by the power of two that makes
    its smallest per-head maximum at least ``boost`` times the tensor's maximum."""

    def raised(x: torch.Tensor) -> torch.Tensor:
        weakest = x[row].float().abs().amax(-1).min()  # the token's weakest head
        if not float(weakest) > 0:
            raise ValueError(f"inputs: token row {row} is zero in some head; the probe raises it by scaling")
        factor = 2.0 ** math.ceil(math.log2(boost * float(x.float().abs().max()) / float(weakest)))
        y = x.clone()
        y[row] *= factor  # a power of two: exact in every float dtype
        return y

    return inputs.with_(q=raised(inputs.q), k=raised(inputs.k), v=raised(inputs.v))


def scale_document(inputs: PackedInputs, doc: int, factor: float) -> PackedInputs:
    """q, k, v and dO of document ``doc`` multiplied by ``factor``."""
    rows = inputs.doc_rows(doc)

    def scaled(x: torch.Tensor) -> torch.Tensor:
        y = x.clone()
        y[rows] *= factor
        return y

    return inputs.with_(q=scaled(inputs.q), k=scaled(inputs.k), v=scaled(inputs.v), do=scaled(inputs.do))


def probe_cut(attn: Attention, inputs: PackedInputs, baseline: TrainingCall, doc: int, cut: int,
              boost: float) -> CausalProbe:
    """The causal probe at position ``cut`` of document ``doc``."""
    rows = inputs.doc_rows(doc)
    length = rows.stop - rows.start
    perturbed = training_call(attn, raise_token(inputs, rows.start + cut, boost), causal=True)
    block_start = cut // BLOCK * BLOCK
    pos = torch.arange(inputs.q.shape[0], device=inputs.q.device) - rows.start
    in_doc = (pos >= 0) & (pos < length)
    new, old = perturbed.by_name(), baseline.by_name()
    earlier = in_doc & (pos < cut)
    changed = torch.stack([(new[n] != old[n])[earlier].flatten(1).any(1)
                           for n in CAUSAL if old[n] is not None]).any(0)  # [cut]
    first = int(changed.nonzero()[0]) if bool(changed.any()) else cut
    return CausalProbe(
        doc, cut, block_start,
        before_block=region_changes(perturbed, baseline, in_doc & (pos < block_start)),
        in_block=region_changes(perturbed, baseline, in_doc & (pos >= block_start) & (pos < cut)),
        other_docs=region_changes(perturbed, baseline, ~in_doc),
        farthest=cut - first)


def probe_document(attn: Attention, inputs: PackedInputs, baseline: TrainingCall, doc: int,
                   factor: float) -> DocumentProbe:
    """The cross-document probe: document ``doc`` multiplied by ``factor``."""
    perturbed = training_call(attn, scale_document(inputs, doc, factor), causal=True)
    rows = inputs.doc_rows(doc)
    others = torch.ones(inputs.q.shape[0], dtype=torch.bool, device=inputs.q.device)
    others[rows] = False
    return DocumentProbe(doc, factor, region_changes(perturbed, baseline, others))


def probe(recipe: "str | Recipe | Attention" = "mxfp8", inputs: PackedInputs | None = None,
          cuts=DEFAULT_CUTS, doc: int = 0, scaled_doc: int | None = None, backend: str | None = None,
          boost: float = 8.0, doc_factor: float = 1000.0, baseline: TrainingCall | None = None) -> ProbeReport:
    """Probe a recipe (name or ``flamia.Recipe``, run through ``flamia.flash_attn_varlen_func``
    with ``backend``) or an attention callable (``flamia.workload.ForwardOnly`` included:
    its probe compares O and, when returned, LSE), causal.

    inputs: default: documents ``PROBE_LENGTHS``, 4 heads, d=128, bf16 (seed 0).
    cuts: positions in document ``doc`` to perturb (one training call each).
    scaled_doc: the document multiplied by ``doc_factor`` (default: the middle one; no
    cross-document probe for a single document). baseline: the unperturbed call on
    ``inputs``, when the caller already has it.
    """
    inputs = make_packed_inputs(PROBE_LENGTHS, heads_q=4) if inputs is None else inputs
    lengths = inputs.lengths
    if scaled_doc is None and len(lengths) > 1:
        scaled_doc = len(lengths) // 2
    for name, index in (("doc", doc), ("scaled_doc", scaled_doc)):
        if index is not None and not 0 <= index < len(lengths):
            raise ValueError(f"{name}: must index one of the {len(lengths)} documents, got {index}")
    bad = [cut for cut in cuts if not 0 < cut < lengths[doc]]
    if bad:
        raise ValueError(f"cuts: {bad} must lie in (0, {lengths[doc]}), inside document {doc}")
    attn = as_attention(recipe, backend)
    baseline = training_call(attn, inputs, causal=True) if baseline is None else baseline
    causal = tuple(probe_cut(attn, inputs, baseline, doc, cut, boost) for cut in cuts)
    documents = None if scaled_doc is None else probe_document(attn, inputs, baseline, scaled_doc, doc_factor)
    unmeasured = tuple(n for n, x in baseline.by_name().items() if x is None)
    return ProbeReport(recipe_label(recipe), inputs.lengths, boost, causal, documents, unmeasured)
