"""`run.py export --workdir=DIR --to=FOLDER`: a workdir's latest parameters as a Hugging Face folder."""

from __future__ import annotations

import argparse
import json

from txjax import config as config_lib
from txjax.convert.workdir import export_workdir
from txjax.ops import preemption


def main(argv: list[str]) -> None:
    """run.py export --workdir=DIR --to=FOLDER: writes config.json, model.safetensors and the tokenizer's files
    (GPT-2, Llama / Qwen2 / Qwen3, Mixtral / Qwen2-MoE / Qwen3-MoE / OLMoE, or Marian) that transformers'
    from_pretrained loads; prints a JSON summary."""
    parser = argparse.ArgumentParser(prog="run.py export", description=main.__doc__, allow_abbrev=False)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--to", required=True, help="the new folder (must not exist, or be empty)")
    args = parser.parse_args(argv)
    with config_lib.user_errors():
        summary = export_workdir(args.workdir, args.to)
    preemption.complete()  # the folder is in place: a signal from here on is no reason to retry
    print(json.dumps(summary))
