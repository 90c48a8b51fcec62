"""The ``flamia`` command line (also ``python -m flamia``).

    flamia demo                      every recipe: accuracy, leakage verdict, GPU speed
    flamia probe --recipe mxfp8 [--exact | --per-tensor | --p4-before-mask] [--backend B] [--peers all]
    flamia accuracy --recipe mxfp8,nvfp4 [--outliers [N]] [--lengths 1000,333,1] [--peers fa2,cudnn:fp8]
    flamia bench ... / flamia train ...   (their own options: flamia bench --help)
    flamia --version

``--peers`` runs the same tool on peer attention libraries (``flamia.bench.peer_attention``)
after the recipe, on the same inputs; a peer that cannot run here prints "n/a: why".
"""
import argparse
import importlib
import sys

import torch

from . import __version__, demo
from .accuracy import DEFAULT_LENGTHS, measure
from .bench.peer_attention import PEERS, PeerUnavailable, peer_attention, select_peers
from .bench.timing import error_reason
from .probe import DEFAULT_CUTS, PROBE_LENGTHS, probe
from .recipes import RECIPES, resolve_recipe
from .workload import Attention, ForwardOnly, PackedInputs, exact_reference, make_packed_inputs, training_call

# Subcommands whose options belong to another module: argv after the name goes to its main().
DELEGATED = {
    "bench": ("flamia.bench.run", "time flamia against peer attention kernels (GPU)"),
    "train": ("flamia.train", "train a small GPT with a chosen attention recipe"),
}


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _recipe_names(text: str) -> tuple[str, ...]:
    names = tuple(text.split(","))
    unknown = [n for n in names if n not in RECIPES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown recipe(s) {unknown}; choose from {sorted(RECIPES)}")
    return names


def _peer_keys(text: str) -> tuple[str, ...]:
    try:
        return select_peers(text)
    except ValueError as exc:  # argparse names the option itself
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--peers: ")) from None


def _device(name: str | None) -> torch.device:
    return torch.device(name or ("cuda" if torch.cuda.is_available() else "cpu"))


def _common(parser: argparse.ArgumentParser, lengths, heads: int) -> None:
    parser.add_argument("--backend", choices=("triton", "reference"), default=None,
                        help="default: triton for mxfp8, nvfp4, fp4 and bf16 on CUDA, else the emulator")
    parser.add_argument("--lengths", type=_ints, default=lengths, help="document lengths, packed")
    parser.add_argument("--heads", type=int, default=heads)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default=None, help="default: cuda when present, else cpu")
    parser.add_argument("--peers", type=_peer_keys, default=(),
                        help="also run peer libraries on the same inputs: 'all' or comma-separated keys "
                             f"({', '.join(PEERS)}) or names (GPU; n/a rows otherwise)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flamia", description="Low-precision FlashAttention for "
                                     "training on packed documents: demo and tools.")
    parser.add_argument("--version", action="version", version=f"flamia {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = sub.add_parser("demo", help="every recipe: accuracy vs FP32, leakage verdict, GPU speed")
    demo.add_argument("--device", default=None, help="default: cuda when present, else cpu")
    demo.add_argument("--no-speed", action="store_true", help="skip the GPU speed comparison")

    pr = sub.add_parser("probe", help="causal and cross-document leakage probe of one recipe")
    pr.add_argument("--recipe", choices=sorted(RECIPES), default="mxfp8")
    pr.add_argument("--exact", action="store_true", help="the exact options: per-token scales (scale_block=1)")
    pr.add_argument("--per-tensor", action="store_true", help="per-tensor scales (the leaking ablation)")
    pr.add_argument("--p4-before-mask", action="store_true",
                    help="4-bit P's group scales before the causal mask (nvfp4, fp4: the leaking 4-bit ablation)")
    pr.add_argument("--cuts", type=_ints, default=DEFAULT_CUTS, help="positions in document 0 to perturb")
    _common(pr, PROBE_LENGTHS, heads=4)

    acc = sub.add_parser("accuracy", help="cosine and relative error against exact attention (Table 4)")
    acc.add_argument("--recipe", type=_recipe_names, default=("mxfp8",), help="comma-separated recipe names")
    acc.add_argument("--outliers", type=int, nargs="?", const=4, default=0,
                     help="outlier channels per K/V head, 20-100x larger (flag alone: 4)")
    acc.add_argument("--non-causal", action="store_true")
    _common(acc, DEFAULT_LENGTHS, heads=16)

    for name, (_, text) in DELEGATED.items():
        sub.add_parser(name, help=text, add_help=False)
    return parser


def _inputs(args, outliers: int = 0):
    return make_packed_inputs(args.lengths, args.heads, args.heads, args.head_dim, torch.bfloat16, outliers,
                              args.seed, _device(args.device))


def run_demo(args) -> int:
    demo.run(args.device, with_speed=not args.no_speed)
    return 0


def run_probe(args) -> int:
    recipe = resolve_recipe(args.recipe)
    if args.exact:
        recipe = recipe.with_(scale_block=1)
    if args.per_tensor:
        recipe = recipe.with_(per_tensor_scales=True)
    if args.p4_before_mask:
        if not recipe.has_p4:
            raise SystemExit(f"flamia probe: --p4-before-mask needs a 4-bit P recipe (nvfp4, fp4), got {args.recipe}")
        recipe = recipe.with_(p4_scale_before_mask=True)
    inputs = _inputs(args)
    print(probe(recipe, inputs, cuts=args.cuts, backend=args.backend).format())
    for text in _peer_texts(args.peers, inputs, True, lambda attn: probe(attn, inputs, cuts=args.cuts).format(),
                            lambda key, why: f"probe of {key}: n/a: {why}"):
        print(text)
    return 0


def run_accuracy(args) -> int:
    inputs = _inputs(args, args.outliers)
    causal = not args.non_causal
    reference = training_call(exact_reference(), inputs, causal)
    for i, name in enumerate(args.recipe):
        result = measure(name, inputs, causal, args.backend, reference, args.outliers)
        if i == 0:
            print(result.describe())
        print(result.format(header=i == 0))

    def row(attn: Attention) -> str:
        return measure(attn, inputs, causal, reference=reference, outliers=args.outliers).format(header=False)

    for text in _peer_texts(args.peers, inputs, causal, row, lambda key, why: f"{key:<14}n/a: {why}"):
        print(text)
    return 0


def _peer_texts(keys, inputs: PackedInputs, causal: bool, run, unavailable):
    """For each peer key: ``run(attention)``, followed by why it ran forward only where it
    did, or ``unavailable(key, why)`` when it cannot run here (a peer library that fails on
    the call is reported the same way, as "error: ...", and the next peer runs)."""
    for key in keys:
        try:
            attn = peer_attention(key, inputs, causal)
            only = f"\n{key}: forward only here ({attn.why})" if isinstance(attn, ForwardOnly) else ""
            yield run(attn) + only
        except PeerUnavailable as exc:
            yield unavailable(key, str(exc))
        except Exception as exc:  # a peer library's failure: its row says so, the others still run
            yield unavailable(key, error_reason(exc))


COMMANDS = {"demo": run_demo, "probe": run_probe, "accuracy": run_accuracy}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in DELEGATED:
        module = importlib.import_module(DELEGATED[argv[0]][0])
        return module.main(argv[1:]) or 0
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except ValueError as exc:  # the library's argument errors name the argument
        parser.error(str(exc))
