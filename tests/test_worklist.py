"""flamia/kernels/worklist.py: the (document, tile) list that the kernels' grids read. Every
tile that holds tokens appears exactly once, the padding says -1, the order is the one the
docstring promises, and the host-side extent bounds the list for any lengths."""
import pytest
import torch

from flamia.kernels.worklist import list_extent, tile_list

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _cu(lengths) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths, dtype=torch.long).cumsum(0).tolist()], dtype=torch.int32,
                        device=DEVICE)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("empty_docs", [False, True])
@pytest.mark.parametrize("lengths", [(37, 1, 0, 70, 9), (256,) * 5, (8192, 256, 256), (0, 0), (1,)])
def test_every_tile_once_in_promised_order(lengths, reverse, empty_docs):
    block = 32
    total = sum(lengths)
    work = tile_list(_cu(lengths), total, block, reverse=reverse, empty_docs=empty_docs)
    assert work.dtype == torch.int32 and work.shape == (2, list_extent(total, len(lengths), block))
    docs, tiles = work.tolist()
    real = [(d, t) for d, t in zip(docs, tiles) if d >= 0]
    assert all(d == -1 for d in docs[len(real):]), "padding only after the real entries"

    counts = [max(-(-n // block), 1 if empty_docs else 0) for n in lengths]
    want = []
    for doc in sorted(range(len(lengths)), key=lambda b: -lengths[b]):  # stable: ties keep their order
        order = range(counts[doc] - 1, -1, -1) if reverse else range(counts[doc])
        want += [(doc, t) for t in order]
    assert real == want


def test_extent_bounds_random_lengths():
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        lengths = torch.randint(0, 300, (int(torch.randint(1, 40, (1,), generator=g)),), generator=g).tolist()
        for block in (16, 32, 64, 128):
            work = tile_list(_cu(lengths), sum(lengths), block, reverse=False, empty_docs=True)
            assert int((work[0] >= 0).sum()) == sum(max(-(-n // block), 1) for n in lengths)
