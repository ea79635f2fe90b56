"""`run.py train`: train (or resume) one run from an experiment file and --config.* overrides."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from txjax import config as config_lib
from txjax.cli import add_distributed_flags, initialize_distributed, parse_with_overrides
from txjax.parallel.distributed import is_lead
from txjax.training.loop import train


def main(argv: list[str]) -> None:
    """run.py train [--config=experiments/NAME.py] [--workdir=DIR] [--config.SECTION.FIELD=VALUE ...]"""
    parser = argparse.ArgumentParser(prog="run.py train", description=main.__doc__, allow_abbrev=False)
    parser.add_argument("--config", help=f"experiment file (default: {config_lib.DEFAULT_EXPERIMENT.name})")
    parser.add_argument("--workdir", help="run folder (default: runs/<experiment name>); resumes if it has one")
    add_distributed_flags(parser)
    args, overrides = parse_with_overrides(parser, argv)
    config = config_lib.from_command_line(args.config, overrides, args.workdir)
    initialize_distributed(args)
    workdir = args.workdir or Path("runs") / Path(args.config or config_lib.DEFAULT_EXPERIMENT).stem
    if args.config is None and args.workdir and (Path(workdir) / config_lib.CONFIG_FILE).is_file() and is_lead():
        print(
            f"resuming with {Path(workdir) / config_lib.CONFIG_FILE}; edits to the experiment file are not applied",
            file=sys.stderr,
            flush=True,
        )
    result = train(config, workdir)
    if is_lead():
        print(json.dumps(result))
