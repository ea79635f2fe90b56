"""`run.py import --from=PATH --workdir=DIR`: a pretrained checkpoint becomes a workdir (txjax.convert.workdir); with
`--base=WORKDIR`, a peft LoRA adapter folder on that workdir's model does."""

from __future__ import annotations

import argparse
import json

from txjax import config as config_lib
from txjax.convert.workdir import import_adapter, import_model
from txjax.ops import preemption


def main(argv: list[str]) -> None:
    """run.py import --from=PATH --workdir=DIR [--config=experiments/NAME.py] [--config.SECTION.FIELD=VALUE ...];
    run.py import --from=ADAPTER_DIR --base=WORKDIR --workdir=DIR: a peft LoRA adapter onto an imported model."""
    parser = argparse.ArgumentParser(prog="run.py import", description=main.__doc__, allow_abbrev=False)
    parser.add_argument(
        "--from",
        dest="source",
        required=True,
        help="a save_pretrained GPT-2 / Llama / Mistral / Qwen2 / Qwen3 / Mixtral / Qwen2-MoE / Qwen3-MoE / OLMoE / "
        "Marian / BART / T5 folder (config.json, safetensors, tokenizer files) or a .gguf file",
    )
    parser.add_argument("--workdir", required=True, help="the new workdir (must not exist, or be empty)")
    parser.add_argument("--config", help="experiment file for the data and train sections")
    parser.add_argument("--base", help="--from is a peft LoRA adapter folder: the workdir of the model it adapts")
    args, overrides = parser.parse_known_args(argv)
    for flag in overrides:
        if not flag.startswith("--config.") or args.base:
            parser.error(
                f"unrecognized argument {flag}" + (" (an adapter takes --base's settings)" if args.base else "")
            )
    with config_lib.user_errors():
        if args.base:
            summary = import_adapter(args.source, args.base, args.workdir)
        else:
            summary = import_model(args.source, args.workdir, args.config, overrides)
    preemption.complete()  # the workdir is in place: a signal from here on is no reason to retry
    print(json.dumps(summary))
