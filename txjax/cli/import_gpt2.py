"""`run.py import-gpt2`: a Hugging Face GPT-2 folder -> a txjax training workdir."""

from __future__ import annotations

import argparse
import json

from txjax import config as config_lib
from txjax.cli import parse_with_overrides
from txjax.convert.workdir import import_gpt2


def main(argv: list[str]) -> None:
    """run.py import-gpt2 --from=DIR --workdir=DIR [--config=experiments/NAME.py] [--config.SECTION.FIELD=VALUE ...]"""
    parser = argparse.ArgumentParser(prog="run.py import-gpt2", description=main.__doc__, allow_abbrev=False)
    parser.add_argument(
        "--from",
        dest="source",
        required=True,
        help="a save_pretrained GPT-2 folder: config.json, model.safetensors, tokenizer files",
    )
    parser.add_argument("--workdir", required=True, help="the new workdir (must not exist, or be empty)")
    parser.add_argument("--config", help="experiment file for the data and train sections")
    args, overrides = parse_with_overrides(parser, argv)
    with config_lib.user_errors():
        print(json.dumps(import_gpt2(args.source, args.workdir, args.config, overrides)))
