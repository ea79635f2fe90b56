"""`run.py sweep`: train every run of a sweep file (vmapped groups where they can share a program), then report."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from txjax.cli import parse_with_overrides
from txjax.sweep import load_sweep, run_sweep


def main(argv: list[str]) -> None:
    """run.py sweep --sweep=experiments/ablations/NAME.py --workdir=DIR [--no-vmap] [--config.SECTION.FIELD=VALUE]"""
    parser = argparse.ArgumentParser(prog="run.py sweep", description=main.__doc__, allow_abbrev=False)
    parser.add_argument("--sweep", required=True, help="sweep file (get_sweep())")
    parser.add_argument("--workdir", help="sweep folder (default: runs/sweeps/<sweep name>); resumes if it has one")
    parser.add_argument(
        "--vmap",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="train runs that differ only in seed / optimizer scalars together (default: on)",
    )
    args, overrides = parse_with_overrides(parser, argv)
    workdir = args.workdir or Path("runs") / "sweeps" / Path(args.sweep).stem
    command = "python run.py sweep " + " ".join(shlex.quote(a) for a in argv)
    try:
        runs = run_sweep(load_sweep(args.sweep), workdir, overrides, args.vmap, command)
    except KeyboardInterrupt:
        print(f"\ninterrupted: run the same command again to resume {workdir}", file=sys.stderr)
        raise SystemExit(130) from None
    failed = sum(r.result.get("status") == "failed" for r in runs)
    print(json.dumps({"workdir": str(workdir), "runs": len(runs), "failed": failed}))
