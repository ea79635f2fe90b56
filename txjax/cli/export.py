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
    from_pretrained loads; a LoRA run (train.lora_rank > 0): a peft adapter folder (adapter_config.json,
    adapter_model.safetensors) that peft.PeftModel.from_pretrained loads onto the model its base was imported from,
    or with --merged its merged weights as above; prints a JSON summary."""
    parser = argparse.ArgumentParser(prog="run.py export", description=main.__doc__, allow_abbrev=False)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--to", required=True, help="the new folder (must not exist, or be empty)")
    parser.add_argument("--merged", action="store_true", help="a LoRA run: its merged weights, not a peft adapter")
    parser.add_argument("--base_model", help="a LoRA run: adapter_config.json's base_model_name_or_path")
    args = parser.parse_args(argv)
    with config_lib.user_errors():
        summary = export_workdir(args.workdir, args.to, args.merged, args.base_model)
    preemption.complete()  # the folder is in place: a signal from here on is no reason to retry
    print(json.dumps(summary))
