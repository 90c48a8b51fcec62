"""benchmarks/kernel_profile.py's report on the CPU: kernel families, the per-family table and
the plot, from records shaped as its GPU run writes them (the profiling itself needs CUDA)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import kernel_profile  # noqa: E402

FA2_BWD = "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<1"
KERNELS = {"attn_fwd_gluon_kernel": ("forward", 4.4), "dkdv_gluon_kernel": ("dK/dV", 12.9),
           "dq_gluon_kernel": ("dQ", 7.0), "_dq_kernel": ("dQ", 0.5),
           "_quantize_operand_kernel": ("other launches", 0.7),
           "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128": ("forward", 6.3),
           FA2_BWD: ("fused backward", 17.7),
           "void pytorch_flash::flash_bwd_convert_dq_kernel<Flash_bwd_kernel_traits": ("other launches", 0.2)}
RECORDS = [{"workload": "eq8x8k", "provider": "fa2:bf16" if "pytorch_flash" in k else "flamia:bf16", "kernel": k,
            "ms": ms, "launches": 1.0} for k, (_, ms) in KERNELS.items()]
HEAD = {"device": "test", "date": "2026-12-05", "command": "python3 benchmarks/kernel_profile.py", "versions": {}}


def test_kernel_families():
    assert {k: kernel_profile.family(k) for k in KERNELS} == {k: f for k, (f, _) in KERNELS.items()}


def test_table_sums_each_family():
    rows = [line for line in kernel_profile.markdown(HEAD, RECORDS).splitlines() if line.startswith("| eq8x8k |")]
    # forward, dK/dV, dQ, fused backward, other launches
    assert rows[0] == "| eq8x8k | flamia:bf16 | 25.500 | 4.400 | 12.900 | 7.500 |  | 0.700 |"
    assert rows[1] == "| eq8x8k | fa2:bf16 | 24.200 | 6.300 |  |  | 17.700 | 0.200 |"


def test_plot_writes_a_png(tmp_path):
    kernel_profile.plot(RECORDS, tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
