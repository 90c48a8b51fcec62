"""A NaN or +Inf in one token of one document stays in that document (NUMERICS.md,
"Non-finite and out-of-range inputs").

One element (head 0, channel 3) of the middle token of document 1 is set to NaN or +Inf in
one operand, Q, K, V or dO; forward and backward run once clean and once poisoned, and every
other document's O, LSE, dQ, dK and dV must be bitwise the clean run's, and finite. Document
layouts: three documents of 300 tokens, and odd lengths with an empty and a one-token
document, the poisoned one of 67 tokens or of a single token. Causal and not, GQA.

What the poisoned document gets (the emulator; the same follows from the arithmetic, so a
kernel must show it too): a non-finite Q, K or V makes some of its O non-finite (the scores
or the values of the rows that see the token are NaN; E4M3 has no Inf, so an Inf operand
becomes a NaN code); any poisoned operand makes some of its dQ and dK non-finite, and a
poisoned Q, K or dO some of its dV (a poisoned V leaves dV = P^T dO finite). A kernel that
silently replaced NaN by zero would fail these checks.

The emulator runs here on the CPU at d=64 with 2 query heads on 1 KV head; the Triton kernels
(``gpu``) at d=64 and d=128, bf16, 4 query heads on 2 KV heads, where the poisoned document
must also be non-finite in every quantity in which the emulator's is.
"""
import pytest
import torch

from flamia.recipes import Recipe
from flamia.workload import PackedInputs, as_attention, make_packed_inputs, training_call

LAYOUTS = {"three-300": (300, 300, 300), "odd": (100, 67, 0, 1, 33), "one-token": (100, 1, 0, 67, 33)}
POISONED_DOC = 1
OPERANDS = ("q", "k", "v", "do")
VALUES = {"nan": float("nan"), "inf": float("inf")}
NAMES = ("O", "LSE", "dQ", "dK", "dV")

_clean_runs: dict = {}


def inputs_for(layout: str, heads: tuple[int, int], head_dim: int, device: str) -> PackedInputs:
    return make_packed_inputs(LAYOUTS[layout], heads[0], heads[1], head_dim, torch.bfloat16, seed=7, device=device)


def poisoned_token(inputs: PackedInputs) -> int:
    rows = inputs.doc_rows(POISONED_DOC)
    return (rows.start + rows.stop - 1) // 2


def poison(inputs: PackedInputs, operand: str, value: float) -> PackedInputs:
    x = getattr(inputs, operand).clone()
    x[poisoned_token(inputs), 0, 3] = value
    return inputs.with_(**{operand: x})


def run(inputs: PackedInputs, causal: bool, backend: str, recipe: str = "mxfp8") -> dict[str, torch.Tensor]:
    """Name -> tensor with the token on axis 0 (LSE as [T, Hq])."""
    return training_call(as_attention(recipe, backend), inputs, causal).by_name()


def clean_run(key, inputs: PackedInputs, causal: bool, backend: str, recipe: str = "mxfp8") -> dict[str, torch.Tensor]:
    if (key, causal, backend, recipe) not in _clean_runs:
        _clean_runs[(key, causal, backend, recipe)] = run(inputs, causal, backend, recipe)
    return _clean_runs[(key, causal, backend, recipe)]


def assert_isolated(clean: dict, poisoned: dict, inputs: PackedInputs, what: str) -> None:
    """Every document but POISONED_DOC: bitwise the clean run's and finite."""
    for doc, length in enumerate(inputs.lengths):
        if doc == POISONED_DOC or length == 0:
            continue
        rows = inputs.doc_rows(doc)
        for name in NAMES:
            a, b = poisoned[name][rows], clean[name][rows]
            assert torch.isfinite(a).all(), f"{what}: {name} of document {doc} is not finite"
            assert torch.equal(a, b), f"{what}: {name} of document {doc} changed ({(a != b).sum().item()} values)"


def nonfinite_in_poisoned_doc(result: dict, inputs: PackedInputs) -> set[str]:
    rows = inputs.doc_rows(POISONED_DOC)
    return {name for name in NAMES if not torch.isfinite(result[name][rows]).all()}


def expected_nonfinite(operand: str) -> set[str]:
    """What the poisoned document must show (the module docstring)."""
    names = {"dQ", "dK"}
    if operand in ("q", "k", "v"):
        names.add("O")
    if operand in ("q", "k", "do"):
        names.add("dV")
    return names


def check(layout, operand, value, causal, backend, heads, head_dim, device,
          recipe: str = "mxfp8") -> tuple[dict, PackedInputs]:
    inputs = inputs_for(layout, heads, head_dim, device)
    clean = clean_run((layout, heads, head_dim, device), inputs, causal, backend, recipe)
    bad = poison(inputs, operand, VALUES[value])
    poisoned = run(bad, causal, backend, recipe)
    what = f"{backend} {recipe}, {value} in {operand} of document {POISONED_DOC}"
    assert_isolated(clean, poisoned, inputs, what)
    got = nonfinite_in_poisoned_doc(poisoned, inputs)
    missing = expected_nonfinite(operand) - got
    assert not missing, f"{what}: its {sorted(missing)} are all finite (non-finite: {sorted(got)})"
    return poisoned, bad


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("value", list(VALUES))
@pytest.mark.parametrize("operand", OPERANDS)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_nonfinite_stays_in_its_document_reference(layout, operand, value, causal):
    check(layout, operand, value, causal, "reference", heads=(2, 1), head_dim=64, device="cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("value", list(VALUES))
@pytest.mark.parametrize("operand", OPERANDS)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_nonfinite_stays_in_its_document_triton(layout, operand, value, causal, head_dim):
    poisoned, bad = check(layout, operand, value, causal, "triton", heads=(4, 2), head_dim=head_dim, device="cuda")
    # The kernels keep non-finite values where the emulator has them (no silent zeroing).
    want = nonfinite_in_poisoned_doc(run(bad, causal, "reference"), bad)
    got = nonfinite_in_poisoned_doc(poisoned, bad)
    assert want <= got, f"{value} in {operand}: the emulator's poisoned document has non-finite {sorted(want)}, " \
                        f"the kernels' only {sorted(got)}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("recipe", ["nvfp4", "bf16", "fp4", Recipe("mxfp8", bf16_scores=True),
                                    Recipe("nvfp4", bf16_scores=True)], ids=["nvfp4", "bf16", "fp4", "mxfp8-bf16s",
                                                                             "nvfp4-bf16s"])
@pytest.mark.parametrize("value", list(VALUES))
@pytest.mark.parametrize("operand", OPERANDS)
def test_nonfinite_stays_in_its_document_other_routes(operand, value, recipe):
    """The mixed NVFP4, the BF16, the all-4-bit and bf16_scores' kernels: isolation, and the
    non-finite results the arithmetic gives (the docstring). The emulator is no oracle here:
    its NVFP4 quantizer refuses a non-finite row."""
    check("odd", operand, value, True, "triton", heads=(4, 2), head_dim=128, device="cuda", recipe=recipe)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("recipe", ["nvfp4", "bf16", "fp4"])
@pytest.mark.parametrize("operand", OPERANDS)
def test_nan_past_a_document_end_stays_out_of_it(operand, recipe):
    """A NaN in the one-token document, which lies inside the previous document's last query
    step: a product over that step's queries or keys must not read it (the bf16 route's dK, dV
    and dQ read Q^'s, dO^'s and K^'s row codes, which hold the next document's tokens there).
    NaN, not +Inf: an Inf in Q can score -inf against the document's only key, and a row whose
    every score is -inf reads as one that saw no key (O = 0), as a masked row does."""
    check("one-token", operand, "nan", True, "triton", heads=(4, 2), head_dim=128, device="cuda", recipe=recipe)
