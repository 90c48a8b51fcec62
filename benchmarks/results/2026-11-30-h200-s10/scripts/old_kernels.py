"""Recreate, from git, the kernel files that the session's A/B calls swapped in as "old" (ab3.py, ab5.py), into
scratch/calls/ (or DIR): python old_kernels.py CALL [DIR], CALL in 2, 3, 4, 6, 8. Run from the repository root."""
import pathlib, subprocess, sys

call, out = sys.argv[1], pathlib.Path(sys.argv[2] if len(sys.argv) > 2 else "scratch/calls")
here = pathlib.Path(__file__).parent


def show(rev, name, imports=None):
    text = subprocess.run(["git", "show", f"{rev}:flamia/kernels/{name}"], capture_output=True, text=True,
                          check=True).stdout
    for old, new in (imports or {}).items():
        assert old in text, (rev, name, old)
        text = text.replace(old, new)
    return text


def write(name, text):
    (out / name).write_text(text)
    print("wrote", out / name)


if call == "2":  # 8428c0a's dK/dV
    write("old_dkdv_gluon.py", show("8428c0a", "attn_dkdv_gluon.py"))
elif call == "3":  # 212c4d1's forward with scores_to_codes' new signature (the multiply after the issue), and dQ
    write("old_fwd_gluon.py", show("212c4d1", "attn_fwd_gluon.py", {
        "scores_to_codes(b_s, b_qf, b_kf, b_vf, b_rf, b_l, b_m, o_n, b_first, b_last,\n"
        "                                                  TAU, (t < u_lo) | (t >= u_hi), False)":
        "scores_to_codes(b_s * b_kf[None, :], b_qf, b_vf, b_rf, b_l, b_m, o_n, b_first,\n"
        "                                                  b_last, TAU, (t < u_lo) | (t >= u_hi), False)"}))
    write("old_dq_gluon.py", show("212c4d1", "attn_dq_gluon.py"))
elif call == "4":  # 81ede52's kernels with their helpers, loaded under other names (ab5.py "modules")
    write("old_fwd_math.py", show("81ede52", "fwd_math.py"))
    write("old_bwd_math.py", show("81ede52", "bwd_math.py"))
    write("old_fwd_gluon.py", show("81ede52", "attn_fwd_gluon.py", {"from .fwd_math import": "from ._old_fwd_math import"}))
    write("old_dq_gluon.py", show("81ede52", "attn_dq_gluon.py", {"from .bwd_math import": "from ._old_bwd_math import"}))
    write("old_dkdv_gluon.py", show("81ede52", "attn_dkdv_gluon.py", {
        "from .bwd_math import": "from ._old_bwd_math import",
        "STAGES: gl.constexpr, ROTATE_STAGES: gl.constexpr, REC_L: gl.constexpr):":
        "STAGES: gl.constexpr, ROTATE_STAGES: gl.constexpr, REC_L: gl.constexpr,\n"
        "                      SCALE_BLOCK: gl.constexpr = 32):  # ab5: the launcher passes it now; unused here"}))
elif call == "6":  # 653e3b9's dK/dV as "old"; the tree of the call was 653e3b9 with call6_rings.patch applied
    write("old653_dkdv_gluon.py", show("653e3b9", "attn_dkdv_gluon.py"))
    print("tree of the call: git checkout 653e3b9 && git apply", here / "call6_rings.patch")
elif call == "8":  # a7ad450's dK/dV as "old"; the tree of the call was a7ad450 with call8_early_records.patch
    write("olda7_dkdv_gluon.py", show("a7ad450", "attn_dkdv_gluon.py"))
    print("tree of the call: git checkout a7ad450 && git apply", here / "call8_early_records.patch")
else:
    sys.exit(f"CALL: one of 2, 3, 4, 6, 8, got {call}")
