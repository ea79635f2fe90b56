"""`run.py inspect`: parameters, FLOPs per token and memory of a config or a workdir; nothing is compiled."""

from __future__ import annotations

import argparse
import tempfile

from txjax import config as config_lib
from txjax.experiment import build_dataset, build_tokenizer, fill_model_sizes
from txjax.ops.summary import summarize


def _config(args, overrides):
    """The run config of a workdir, or an experiment's with vocab_size/max_len filled from its data when left 0."""
    if args.workdir:
        return config_lib.load(args.workdir)
    config = config_lib.from_command_line(args.config, overrides)
    if not (config.model.vocab_size and config.model.max_len):
        with config_lib.user_errors(), tempfile.TemporaryDirectory() as tmp:  # the tokenizer is built, not kept
            tokenizer = build_tokenizer(config, tmp)
            fill_model_sizes(config, tokenizer, build_dataset(config, tokenizer, "train"))
    return config


def main(argv: list[str]) -> None:
    """run.py inspect (--config=experiments/NAME.py [--config.SECTION.FIELD=VALUE ...] | --workdir=DIR)
    [--batch_size=N] [--context=N]: parameters, FLOPs per token and memory; nothing is compiled."""
    parser = argparse.ArgumentParser(prog="run.py inspect", description=main.__doc__, allow_abbrev=False)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--config", help=f"experiment file (default: {config_lib.DEFAULT_EXPERIMENT.name})")
    source.add_argument("--workdir", help="a run's folder: its config.json")
    parser.add_argument("--batch_size", type=int, help="KV cache batch (default: config.train.batch_size)")
    parser.add_argument("--context", type=int, help="T and the KV cache length (default: config.model.max_len)")
    args, overrides = parser.parse_known_args(argv)
    for flag in overrides:
        if not flag.startswith("--config.") or args.workdir:
            parser.error(f"unrecognized argument {flag} (--config.* overrides go with --config, not --workdir)")
    config = _config(args, overrides)
    cfg = config_lib.model_config(config.model.to_dict())
    summary = summarize(cfg, config.family, args.batch_size or config.train.batch_size, args.context or cfg.max_len)
    print(f"{config.family}: {cfg}")
    print(summary.table())
