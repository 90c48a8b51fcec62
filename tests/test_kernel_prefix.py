"""flamia/kernels/prefix.py: PV in one launch equals the emulator's prefix_v_exponent
(flamia/scaling.py) exactly, for causal and non-causal masks, windows, queries and keys of
different lengths per document, empty and one-token documents, and many documents (the
binary search over cu_seqlens)."""
import pytest
import torch

from flamia.kernels.prefix import prefix_v_exponent as prefix_kernel
from flamia.scaling import prefix_v_exponent as prefix_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _cu(lengths) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths, dtype=torch.long).cumsum(0).tolist()], dtype=torch.int32)


def _block_exponents(lengths_k, heads, block, g) -> torch.Tensor:
    """[sum(lengths_k), heads] int8, one random exponent per document-local block of keys."""
    parts = []
    for n in lengths_k:
        per_block = torch.randint(-100, 128, (-(-n // block), heads), generator=g)
        parts.append(per_block.repeat_interleave(block, dim=0)[:n])
    return torch.cat(parts).to(torch.int8)


CASES = [  # (lengths_q, lengths_k)
    ((37, 1, 0, 70, 9), (37, 1, 0, 70, 9)),
    ((5, 64, 130), (40, 64, 3)),
    ((0, 200), (33, 0)),
    (tuple(range(1, 80, 2)), tuple(range(1, 80, 2))),  # 40 documents
]


@pytest.mark.parametrize("lengths", CASES)
@pytest.mark.parametrize("causal,window", [(True, (-1, -1)), (False, (-1, -1)), (False, (16, 5)), (True, (40, -1)),
                                           (False, (-1, 0))])
@pytest.mark.parametrize("block", [32, 1])
def test_kernel_equals_reference(lengths, causal, window, block):
    lengths_q, lengths_k = lengths
    g = torch.Generator().manual_seed(len(lengths_q) * 7 + block)
    ev = _block_exponents(lengths_k, 3, block, g)
    ev, cu_q, cu_k = ev.to(DEVICE), _cu(lengths_q).to(DEVICE), _cu(lengths_k).to(DEVICE)
    want = prefix_reference(ev, cu_q, cu_k, sum(lengths_q), causal, window)
    got = prefix_kernel(ev, cu_q, cu_k, sum(lengths_q), causal, window, block)
    assert got.dtype == torch.int32 and torch.equal(got, want)
