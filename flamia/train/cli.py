"""``flamia train`` (also ``python -m flamia.train``): a profile, flags on top, one run.

    flamia train --run mxfp8 [--profile smoke|small|small-sumq|paper|paper-sumq] [--steps 300 ...] [--resume]
    flamia train --report [--results-dir DIR] [--baseline DIR:RUN,RUN]   # table and curves

Every ``TrainConfig`` field is a flag (``--eval-interval`` for ``eval_interval``); a flag left
out keeps the profile's value. A setting that cannot work ends in one line naming its flag.
"""
import argparse
import time
import typing
from dataclasses import fields
from pathlib import Path

from .config import PROFILES, RUNS, SettingError, TrainConfig, make_config
from .loop import train

PROG = "flamia train"
CHOICES = {"run": sorted(RUNS), "backend": ["triton", "reference"]}


def _arg_type(hint):
    """int for ``int | None`` and so on: the type argparse converts to."""
    return next((a for a in typing.get_args(hint) if a is not type(None)), hint)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Train the byte-level GPT on packed documents "
                                "with one attention numerics (--run), or report the runs' results.")
    p.add_argument("--resume", action="store_true", help="continue from <ckpt_dir>/<run>.pt if it exists")
    p.add_argument("--report", action="store_true", help="write the results table and curves, then exit")
    p.add_argument("--baseline", metavar="DIR:RUN,RUN", help="with --report: also these runs of another results folder")
    p.add_argument("--profile", choices=sorted(PROFILES), default="smoke",
                   help="the settings the flags below change")
    hints = typing.get_type_hints(TrainConfig)
    for f in fields(TrainConfig):
        if f.name == "profile":
            continue
        kind = _arg_type(hints[f.name])
        option = "--" + f.name.replace("_", "-")
        if kind is bool:
            p.add_argument(option, action=argparse.BooleanOptionalAction, default=None)
            continue
        per_profile = {name: values.get(f.name, f.default) for name, values in PROFILES.items()}
        default = (f"default {f.default!r}" if len(set(map(repr, per_profile.values()))) == 1
                   else ", ".join(f"{name}: {value!r}" for name, value in per_profile.items()))
        p.add_argument(option, type=kind, default=None, choices=CHOICES.get(f.name), help=default)
    return p


def parse_args(argv: list[str] | None) -> tuple[TrainConfig, argparse.Namespace]:
    """The run's configuration and the other flags (--resume, --report, --baseline);
    SettingError for a value that cannot work."""
    args = build_parser().parse_args(argv)
    overrides = {f.name: getattr(args, f.name) for f in fields(TrainConfig)
                 if f.name != "profile" and getattr(args, f.name) is not None}
    return make_config(args.profile, **overrides), args


def report(cfg: TrainConfig, baseline: str | None) -> None:
    """Write the results table and curves of ``cfg.results_dir``; print their paths."""
    from .report import load_baseline, write_report  # matplotlib: only for --report

    for path in write_report(Path(cfg.results_dir), load_baseline(baseline) if baseline else None):
        print(path)


def main(argv: list[str] | None = None) -> None:
    t_start = time.monotonic()
    try:
        cfg, args = parse_args(argv)
        if args.report:
            report(cfg, args.baseline)
        else:
            train(cfg, resume=args.resume, t_start=t_start)
    except SettingError as exc:
        raise SystemExit(f"{PROG}: error: {exc}") from None
