"""benchmarks/sass_offline.py: the attention kernels compile for Hopper (sm_90a) without a GPU,
with the launch arguments of a real training call, and both of each kernel's products are FP8
wgmma (QGMMA) in the SASS, inside its step loops, which ptxas did not serialize (C7512), beside
the forward's row sum as an FP16 wgmma; the forward's unmasked tiles branch around the mask. The
bf16 and 4-bit routes' launches compile too, with the installed Triton."""
import json
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import sass_offline  # noqa: E402

needs_cuobjdump = pytest.mark.skipif(
    shutil.which("cuobjdump") is None and not Path(sass_offline._tool("cuobjdump")).exists(),
    reason="needs cuobjdump (Triton's NVIDIA backend ships one)")


@needs_cuobjdump
def test_attention_kernels_use_fp8_wgmma(tmp_path):
    out = tmp_path / "sass.json"
    assert sass_offline.main(["--workload", "logu11-16k", "--kernels", "^(attn_fwd_gluon_kernel|dkdv_gluon_kernel|dq_gluon_kernel)$",
                              "--out", str(out)]) == 0
    kernels = json.loads(out.read_text())["kernels"]
    assert sorted(label.split()[0] for label in kernels) == ["attn_fwd_gluon_kernel", "dkdv_gluon_kernel", "dq_gluon_kernel"]
    for label, r in kernels.items():
        step = r["inner_loop"]["opcodes"]  # the unmasked step loop's opcode counts
        assert r["QGMMA"] > 0 and step.get("QGMMA", 0) >= 2, f"{label}: the step loop's products are not FP8 wgmma"
        # The one 16-bit MMA allowed: the forward's row sum of the P codes' f16 values (p_sum_codes'
        # default) against its [128 keys, 8] block indicator, 128 / 16 instructions per key tile.
        row_sum = {"HGMMA.64x8x16.F32": 8} if label.startswith("attn_fwd_gluon_kernel") else {}
        wide = {op: n for op, n in r["inner_loop"]["mma"].items() if not op.startswith("QGMMA")}
        assert wide == row_sum, f"{label}: 16-bit MMAs in the step loop: {wide}"
        serialized = [w for w in r["ptxas_warnings"] if "C7512" in w]
        assert not serialized, f"{label}: ptxas serialized every wgmma: {serialized}"
        straight = r["inner_loop"]["straight"]["opcodes"]
        assert straight.get("QGMMA", 0) == step["QGMMA"], f"{label}: a branch can skip a product"
    # The forward runs masked and unmasked tiles in one loop: a branch must skip the mask (two
    # compares and two selects per score, a quarter of the step) on the tiles every row sees.
    forward = next(r for label, r in kernels.items() if label.startswith("attn_fwd_gluon_kernel"))
    scores_per_thread = 64 * 128 // 128
    assert forward["inner_loop"]["opcodes"].get("FSEL", 0) >= scores_per_thread, "no mask in the forward's loop?"
    assert forward["inner_loop"]["straight"]["opcodes"].get("FSEL", 0) < scores_per_thread // 4, \
        "the forward's unmasked tiles run the mask"


@needs_cuobjdump
def test_bf16_attention_kernels_use_bf16_wgmma(tmp_path):
    """The bf16 recipe's launches of the same kernels: every product is BF16 wgmma (HGMMA) in
    the step loops, none FP8, none serialized; the register A operands' layouts convert
    without data movement (the kernels' ``assert_trivial`` would fail the compile)."""
    out = tmp_path / "sass.json"
    assert sass_offline.main(["--workload", "logu11-16k", "--recipe", "bf16", "--kernels",
                              "^(attn_fwd_gluon_kernel|dkdv_gluon_kernel|dq_gluon_kernel)$", "--out", str(out)]) == 0
    kernels = json.loads(out.read_text())["kernels"]
    assert sorted(label.split()[0] for label in kernels) == ["attn_fwd_gluon_kernel", "dkdv_gluon_kernel", "dq_gluon_kernel"]
    for label, r in kernels.items():
        step = r["inner_loop"]["opcodes"]
        assert r["QGMMA"] == 0 and step.get("HGMMA", 0) >= 2, f"{label}: the step loop's products are not BF16 wgmma"
        assert not [w for w in r["ptxas_warnings"] if "C7512" in w], f"{label}: ptxas serialized every wgmma"
        assert r["shared_bytes"] <= 227 * 1024, f"{label}: {r['shared_bytes']} B of shared memory"


@needs_cuobjdump
@pytest.mark.parametrize("recipe", ["nvfp4", "fp4"])
def test_4bit_attention_kernels_compile_for_two_programs_per_sm(tmp_path, recipe):
    """The 4-bit routes' launches of the Gluon attention kernels (4-bit P, its group exponents
    shared through shared memory in dK/dV) compile with the installed Triton, whose Gluon
    names differ between versions: wgmma in every step loop, none serialized, and at most
    half an SM's shared memory each (228 KB, 1 KB of it reserved per program), so two
    programs share an SM as the tiles intend (docs/PERFORMANCE.md)."""
    out = tmp_path / "sass.json"
    assert sass_offline.main(["--workload", "logu11-16k", "--recipe", recipe, "--kernels",
                              "^(attn_fwd_gluon_kernel|dkdv_gluon_kernel|dq_gluon_kernel)$", "--out", str(out)]) == 0
    kernels = json.loads(out.read_text())["kernels"]
    assert sorted(label.split()[0] for label in kernels) == ["attn_fwd_gluon_kernel", "dkdv_gluon_kernel", "dq_gluon_kernel"]
    for label, r in kernels.items():
        step = r["inner_loop"]["opcodes"]
        assert step.get("QGMMA", 0) + step.get("HGMMA", 0) >= 2, f"{label}: no wgmma in the step loop"
        assert not [w for w in r["ptxas_warnings"] if "C7512" in w], f"{label}: ptxas serialized every wgmma"
        assert r["shared_bytes"] <= (228 * 1024) // 2 - 1024, f"{label}: {r['shared_bytes']} B of shared memory"


@needs_cuobjdump
@pytest.mark.parametrize("option", [[], ["--bf16-scores"]], ids=["mxfp8", "mxfp8-bf16s"])
def test_rotated_quantizer_butterflies_stay_in_registers(tmp_path, option):
    """The Gluon Q/K launch holds a token row per thread: each of the 7 butterfly stages of a
    128-wide row is one FADD per element in the thread (896 in all), and the only exchange
    between threads is the 32-row block maximum (5 butterfly shuffles); nothing spills, also
    with BF16 row codes (``bf16_scores``). The launch quantizes Q and K (PAIR): Triton 3.6
    gives each operand's branch its own copy of that code, newer Tritons share one copy
    between the branches."""
    out = tmp_path / "sass.json"
    assert sass_offline.main(["--workload", "logu11-16k", "--kernels", "^rotated_operand_kernel$",
                              "--out", str(out), *option]) == 0
    (r,) = json.loads(out.read_text())["kernels"].values()
    copies, rest = divmod(r["opcodes"]["FADD"], 7 * 128)
    assert rest == 0 and copies in (1, 2) and r["opcodes"].get("SHFL", 0) <= copies * 5, r["opcodes"]
    assert r["LDL/STL"] == 0


@needs_cuobjdump
def test_rotated_quantizer_forms_nvfp4_groups_in_registers(tmp_path):
    """The mixed route's Q/K launch forms its NVFP4 score codes in the Gluon rotated kernel: a
    row's 16-element groups lie in its thread, so the only exchange between threads is the
    block maximum, and x / (s g) takes no division per element (``fp4.divide_by_scale``):
    the divisions left are two per group (its scale's reciprocal and the rounded-up ratio;
    the check compares with 6 s g, ``fp4.past_e2m1_max``). The kernel has no loop, so each spilled value costs one local store and load
    per program: fewer than a quarter of a row's 128 (with a division per element, ptxas
    spilled 400 per operand's copy)."""
    out = tmp_path / "sass.json"
    assert sass_offline.main(["--workload", "logu11-16k", "--recipe", "nvfp4", "--kernels", "^rotated_operand_kernel$",
                              "--out", str(out)]) == 0
    (r,) = json.loads(out.read_text())["kernels"].values()
    # Triton 3.6 gives each operand's branch its own copy of the unit (above), newer Tritons one
    copies, rest = divmod(r["opcodes"].get("FCHK", 0), 2 * (128 // 16))
    assert rest == 0 and copies in (1, 2), r["opcodes"]
    assert r["opcodes"].get("SHFL", 0) <= copies * 5, r["opcodes"]
    assert r["LDL/STL"] < copies * 32


@needs_cuobjdump
def test_fp4_operands_hold_a_group_per_thread(tmp_path):
    """The all-4-bit Q/K and V launches are the Gluon kernel of fp4_quantizer_gluon.py: a
    thread holds one 16-element group of a row (two divisions per group: its scale's
    reciprocal and the rounded-up ratio) and 16 tokens of one transposed row, so
    threads exchange only a row's maximum and NaN flag (a butterfly over the D / 16 threads of
    a row each), and nothing spills."""
    out = tmp_path / "sass.json"
    assert sass_offline.main(["--workload", "logu11-16k", "--recipe", "fp4", "--kernels", "^fp4_operand_kernel$",
                              "--out", str(out)]) == 0
    kernels = json.loads(out.read_text())["kernels"]
    assert len(kernels) == 2  # the Q and K launch, V's
    for r in kernels.values():
        copies, rest = divmod(r["opcodes"].get("FCHK", 0), 2)  # the pair's branches: one copy or two
        assert rest == 0 and copies in (1, 2), r["opcodes"]
        assert r["opcodes"].get("SHFL", 0) <= copies * 2 * 3, r["opcodes"]
        assert r["LDL/STL"] == 0


@needs_cuobjdump
def test_fp4_grad_output_holds_a_group_per_thread(tmp_path):
    """The all-4-bit dO launch is the Gluon kernel of fp4_quantizer_gluon.py: a thread holds one
    16-element group of a row (two divisions per group: its scale's reciprocal and the
    rounded-up ratio; a third is the query record's D / 2^edO) and 16 tokens of one transposed row, so threads exchange
    only a row's maximum, its NaN flag and its sum D (a butterfly over the D / 16 threads of
    a row each: the Triton launch takes 66 shuffles), and nothing spills."""
    out = tmp_path / "sass.json"
    assert sass_offline.main(["--workload", "logu11-16k", "--recipe", "fp4", "--kernels", "^fp4_grad_output_kernel$",
                              "--out", str(out)]) == 0
    (r,) = json.loads(out.read_text())["kernels"].values()
    assert r["opcodes"].get("FCHK", 0) == 2 + 1 and r["opcodes"].get("SHFL", 0) <= 3 * 3, r["opcodes"]
    assert r["LDL/STL"] == 0
