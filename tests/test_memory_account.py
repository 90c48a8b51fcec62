"""benchmarks/memory_account.py: the live-storage count behind its peak, and one recipe's
account on a real workload's shapes."""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import memory_account  # noqa: E402

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="counts CPU allocations")


def test_views_and_frees_are_counted_once():
    before = torch.zeros(1000)  # made outside the count: its views add nothing
    with memory_account.LiveStorages() as mode:
        a = torch.empty(4096, dtype=torch.uint8)
        view = a[1024:]
        b = before.view(10, 100)
        del a
        assert mode.live == 4096  # the view keeps a's storage alive
        del view
        assert mode.live == 0
        c = torch.empty(100, dtype=torch.float32).add_(1.0)  # in place: the same storage
        assert mode.live == 400
    assert mode.peak == 4096
    assert [entry[0] for entry in mode.at_peak] == [4096]
    del b, c


def test_account_lists_what_makes_the_peak():
    result = memory_account.account("eq4x4k", "mxfp8")
    tensor = 4 * 4096 * 16 * 128 * 2  # a bf16 [T, H, D] of eq4x4k
    rows = result["at_peak"]
    assert sum(r["gb"] for r in rows) == pytest.approx(result["peak_gb"], rel=1e-9)
    # the job's clones of q, k and v, the output and the three gradients are all live
    bf16 = sum(r["count"] for r in rows if r["dtype"] == "bfloat16" and r["shape"] == [4 * 4096, 16, 128])
    assert bf16 == 7
    assert any("attn_bwd" in r["where"] for r in rows) and any("quantize" in r["where"] for r in rows)
    assert result["peak_gb"] > 7 * tensor / 1e9
