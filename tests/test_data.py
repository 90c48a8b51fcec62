"""flamia.data: reading, splitting, document starts and packed rows with their cu_seqlens."""
import lzma
import zipfile

import numpy as np
import pytest
import torch

from flamia.data import PackedText, copy_source, doc_starts, load_bytes, split


def as_bytes(text: str) -> np.ndarray:
    return np.frombuffer(text.encode(), dtype=np.uint8)


def test_doc_starts_after_each_run_of_separators():
    # "a\n\nb\n\n\nc": documents start at "b" (3) and "c" (7); the third newline makes no
    # one-byte document of its own.
    assert doc_starts(as_bytes("a\n\nb\n\n\nc"), b"\n\n").tolist() == [3, 7]
    assert doc_starts(as_bytes("abc"), b"\n\n").tolist() == []
    assert doc_starts(as_bytes("x||y|z"), b"||").tolist() == [3]


def test_split_is_90_5_5_in_order():
    data = np.arange(1000, dtype=np.int64).astype(np.uint8)
    train, val, test = split(data)
    assert (len(train), len(val), len(test)) == (900, 50, 50)
    assert np.array_equal(np.concatenate([train, val, test]), data)


def test_load_bytes_reads_xz_and_copy_source_reads_zip(tmp_path):
    raw = b"some text\n\nmore text\xff\x00"
    (tmp_path / "t.xz").write_bytes(lzma.compress(raw))
    assert load_bytes(tmp_path / "t.xz").tobytes() == raw
    with zipfile.ZipFile(tmp_path / "enwik8.zip", "w") as z:
        z.writestr("enwik8", raw)
    copy_source(tmp_path / "enwik8.zip", tmp_path / "out")
    assert load_bytes(tmp_path / "out").tobytes() == raw
    with pytest.raises(FileNotFoundError, match="data: no such file"):
        load_bytes(tmp_path / "missing")


def test_batch_rows_documents_and_positions():
    text = "aaaa\n\nbb\n\ncccccc\n\nd"          # documents start at 6, 10, 18
    packed = PackedText(as_bytes(text), b"\n\n", context=8)
    batch = packed.batch(np.array([0, 8]), "cpu")
    # Row 0 = text[0:8] "aaaa\n\nbb": documents [0, 6), [6, 8). Row 1 = text[8:16]
    # "\n\ncccccc": the cut end of "bb\n\n" [8, 10), then [10, 16).
    assert batch.cu_seqlens.dtype == torch.int32
    assert batch.cu_seqlens.tolist() == [0, 6, 8, 10, 16]
    assert batch.max_seqlen == 6
    assert batch.doc_lengths.tolist() == [6, 2, 2, 6]
    assert batch.pos.tolist() == [0, 1, 2, 3, 4, 5, 0, 1, 0, 1, 0, 1, 2, 3, 4, 5]
    assert batch.doc.tolist() == [[0] * 6 + [1] * 2, [2] * 2 + [3] * 6]
    assert bytes(batch.x[0].tolist()) == b"aaaa\n\nbb"
    assert bytes(batch.y[1].tolist()) == text[9:17].encode()


def test_training_offsets_depend_on_seed_and_step_only():
    packed = PackedText(as_bytes("word " * 400), b"\n\n", context=16)
    a = packed.random_offsets(8, seed=1, step=5)
    assert np.array_equal(a, packed.random_offsets(8, seed=1, step=5))
    assert not np.array_equal(a, packed.random_offsets(8, seed=1, step=6))
    assert a.min() >= 0 and a.max() + 16 < 2000
    spread = packed.spread_offsets(4)
    assert spread[0] == 0 and spread[-1] + 16 == 2000 - 1
