"""Train a small byte-level GPT on packed documents with flamia's low-precision attention.

    python examples/train_gpt.py                     # data/english-text.txt, sizes for this machine
    python examples/train_gpt.py --steps 20 --no-compile --data my.txt

The text is read as bytes (vocabulary 256); a document ends at a blank line. A training row
is `context` consecutive bytes at a random offset: the documents it overlaps are cut at the
row's ends and marked by `cu_seqlens`, so attention never crosses a document boundary, and
positions count from each document's start. Attention is `flamia.nn.DocumentAttention`.

On a CUDA GPU the model is a 6-layer GPT of width 768 (12 heads of 64) under bf16 autocast,
with the mxfp8 recipe on flamia's Triton kernels. Without one it is a 2-layer toy with the
emulator (backend "reference"), which runs a few steps in about a minute.
"""
import argparse
import lzma
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import flamia.nn

SIZES = {  # per device type: what the defaults of the size flags become
    "cuda": dict(n_layer=6, d_model=768, n_head=12, context=1024, batch_size=32, steps=2000, lr=6e-4,
                 recipe="mxfp8", backend=None, log_every=10),
    "cpu": dict(n_layer=2, d_model=64, n_head=2, context=128, batch_size=4, steps=10, lr=2e-3,
                recipe="mxfp8", backend="reference", log_every=2),
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=Path("data/english-text.txt"),
                   help="any file, read as bytes (.xz is decompressed)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--n-layer", type=int)
    p.add_argument("--d-model", type=int)
    p.add_argument("--n-head", type=int, help="head dim = d_model / n_head (64 or 128 on the Triton kernels)")
    p.add_argument("--context", type=int, help="bytes per row")
    p.add_argument("--batch-size", type=int, help="rows per step")
    p.add_argument("--steps", type=int)
    p.add_argument("--lr", type=float, help="peak learning rate (AdamW, warmup then cosine)")
    p.add_argument("--recipe", help="a name of flamia.RECIPES")
    p.add_argument("--backend", choices=["triton", "reference"],
                   help="default: flamia's choice on CUDA (triton for mxfp8), reference on the CPU")
    p.add_argument("--no-compile", dest="compile", action="store_false", help="run the model eagerly")
    p.add_argument("--log-every", type=int, help="steps between progress lines")
    p.add_argument("--eval-batches", type=int, default=4, help="validation batches at the end")
    p.add_argument("--seed", type=int, default=1337)
    args = p.parse_args(argv)
    for name, value in SIZES["cuda" if args.device.startswith("cuda") else "cpu"].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


# ---------------------------------------------------------------------------------------------
# Data: bytes, documents, packed rows
# ---------------------------------------------------------------------------------------------

def load_bytes(path: Path) -> np.ndarray:
    if not path.exists():
        sys.exit(f"data: no such file {path}; build it with `python -m flamia.data --out {path}` "
                 f"(or shared/data/build_english_text.sh {path}), or pass --data FILE")
    raw = lzma.open(path).read() if path.suffix == ".xz" else path.read_bytes()
    return np.frombuffer(raw, dtype=np.uint8)


def document_starts(data: np.ndarray) -> np.ndarray:
    """Offsets right after each blank line ("\\n\\n"), int64 [num]."""
    return np.flatnonzero((data[:-1] == 10) & (data[1:] == 10)) + 2


def get_batch(data: np.ndarray, starts: np.ndarray, rows: int, context: int, rng: np.random.Generator,
              device: str):
    """`rows` random rows of `context` bytes, flattened into T = rows * context tokens.

    Returns x, y int64 [T] (y: the byte after x's), pos int64 [T] (position in its document),
    cu_seqlens int32 [num_docs + 1] (a document starts at every row and after every blank
    line inside one) and max_seqlen, the longest document (a host int).
    """
    offsets = rng.integers(0, len(data) - context - 1, size=rows)
    windows = np.stack([data[o:o + context + 1] for o in offsets]).astype(np.int64)
    cu = [0]
    for row, offset in enumerate(offsets):
        inside = starts[np.searchsorted(starts, offset, side="right"):np.searchsorted(starts, offset + context)]
        cu += [*(row * context + inside - offset), (row + 1) * context]
    cu = np.array(cu)
    lengths = np.diff(cu)
    pos = np.arange(rows * context) - np.repeat(cu[:-1], lengths)
    tensors = (windows[:, :-1].reshape(-1), windows[:, 1:].reshape(-1), pos, cu.astype(np.int32))
    x, y, pos, cu_seqlens = (torch.from_numpy(np.ascontiguousarray(a)).to(device) for a in tensors)
    return x, y, pos, cu_seqlens, int(lengths.max())


# ---------------------------------------------------------------------------------------------
# Model: pre-LN GPT over packed tokens [T, d_model]
# ---------------------------------------------------------------------------------------------

class Block(nn.Module):
    def __init__(self, d_model: int, n_head: int, recipe: str, backend: str | None):
        super().__init__()
        self.n_head = n_head
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.attention = flamia.nn.DocumentAttention(recipe=recipe, causal=True, backend=backend)
        self.proj = nn.Linear(d_model, d_model, bias=False)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model, bias=False), nn.GELU(),
                                 nn.Linear(4 * d_model, d_model, bias=False))

    def forward(self, x, cu_seqlens, max_seqlen):
        q, k, v = self.qkv(self.ln1(x)).view(x.shape[0], 3, self.n_head, -1).unbind(1)  # [T, H, D] each
        x = x + self.proj(self.attention(q, k, v, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen).flatten(1))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.tokens = nn.Embedding(256, args.d_model)
        self.positions = nn.Embedding(args.context, args.d_model)
        self.blocks = nn.ModuleList(Block(args.d_model, args.n_head, args.recipe, args.backend)
                                    for _ in range(args.n_layer))
        self.ln_f = nn.LayerNorm(args.d_model)
        self.head = nn.Linear(args.d_model, 256, bias=False)
        self.head.weight = self.tokens.weight  # tied
        for module in self.modules():  # GPT-2's initialisation
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)

    def forward(self, x, y, pos, cu_seqlens, max_seqlen):
        """get_batch's tensors; returns the mean cross-entropy of predicting y from x."""
        h = self.tokens(x) + self.positions(pos)
        for block in self.blocks:
            h = block(h, cu_seqlens, max_seqlen)
        return F.cross_entropy(self.head(self.ln_f(h)).float(), y)


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------

def main(argv=None) -> None:
    args = parse_args(argv)
    data = load_bytes(args.data)
    n_train = int(0.9 * len(data))
    train, val = data[:n_train], data[n_train:]
    if len(val) <= args.context + 1:  # val is the smaller split
        sys.exit(f"data: {args.data} ({len(data)} bytes) is too short for rows of {args.context} bytes")
    train_starts, val_starts = document_starts(train), document_starts(val)

    torch.manual_seed(args.seed)
    model = GPT(args).to(args.device)
    print(f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, {args.n_layer} layers, "
          f"d_model {args.d_model}, {args.n_head} heads, recipe {args.recipe}, device {args.device}")
    if args.compile:
        print("compiling the model: the first steps take longer")
    forward = torch.compile(model) if args.compile else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    warmup = max(1, args.steps // 20)
    autocast = torch.autocast(args.device.split(":")[0], dtype=torch.bfloat16,
                              enabled=args.device.startswith("cuda"))
    rng = np.random.default_rng(args.seed)

    tokens, clock = 0, time.perf_counter()
    for step in range(1, args.steps + 1):
        lr = args.lr * min(step / warmup, 0.1 + 0.45 * (1 + math.cos(math.pi * step / args.steps)))
        for group in optimizer.param_groups:
            group["lr"] = lr
        batch = get_batch(train, train_starts, args.batch_size, args.context, rng, args.device)
        with autocast:
            loss = forward(*batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        tokens += batch[0].numel()
        if step % args.log_every == 0 or step == args.steps:
            loss_value = loss.item()  # waits for the GPU
            elapsed = time.perf_counter() - clock
            print(f"step {step:5d}  loss {loss_value:.4f}  lr {lr:.2e}  {tokens / elapsed:,.0f} tokens/s")
            tokens, clock = 0, time.perf_counter()

    eval_rng = np.random.default_rng(0)
    with torch.no_grad(), autocast:  # eagerly: a no-grad call would compile the model again
        losses = [model(*get_batch(val, val_starts, args.batch_size, args.context, eval_rng, args.device)).item()
                  for _ in range(args.eval_batches)]
    mean = sum(losses) / len(losses)
    print(f"validation loss {mean:.4f} ({mean / math.log(2):.3f} bits per byte)")


if __name__ == "__main__":
    main()
