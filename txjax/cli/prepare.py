"""run.py prepare: tokenize a corpus once into shards that `data.kind="shards"` trains from (txjax.data.prepare)."""

from __future__ import annotations

import argparse
import codecs
import json

from txjax.config import user_errors
from txjax.data.prepare import prepare
from txjax.data.prepare_tokenizer import RECIPES
from txjax.data.readers import FORMATS
from txjax.ops import preemption


def main(argv: list[str]) -> None:
    """run.py prepare --input=FILES_OR_GLOBS --output=DIR [--tokenizer=char|byte|sentencepiece|bpe|WORKDIR] [...]:
    writes DIR (shards of token ids, index.json, tokenizer/), prints a summary as one JSON line. A rerun with the
    same inputs and options does nothing; an interrupted one leaves only DIR.partial-PID, which the next removes."""
    parser = argparse.ArgumentParser(prog="run.py prepare", description=main.__doc__, allow_abbrev=False)
    parser.add_argument(
        "--input", action="append", required=True, help="files, globs or folders, comma-separated or repeated"
    )
    parser.add_argument("--output", required=True, help="the folder to write (train with --config.data.path=DIR)")
    parser.add_argument("--tokenizer", default="char", help=f"{', '.join(RECIPES)}, or a workdir / tokenizer folder")
    parser.add_argument("--format", default="", choices=("", *FORMATS), help="default: from the file names")
    parser.add_argument("--delimiter", default="", help=r"text: between documents, e.g. '\n\n' (default: a file each)")
    parser.add_argument("--field", default="text", help="jsonl, parquet, arrow: the field (column) that holds the text")
    parser.add_argument("--vocab_size", type=int, default=8000, help="sentencepiece, bpe: ids to train")
    parser.add_argument("--sample_mb", type=float, default=64.0, help="sentencepiece, bpe: MB of documents to train on")
    parser.add_argument("--valid_fraction", type=float, default=0.01, help="documents split off for validation")
    parser.add_argument("--shard_mb", type=float, default=16.0, help="MB of input per shard (one worker task each)")
    parser.add_argument("--workers", type=int, default=0, help="worker processes (default: one per CPU core)")
    parser.add_argument(
        "--chat",
        action="store_true",
        help="jsonl, parquet: conversations ('messages') rendered with the --tokenizer=WORKDIR's chat template, their "
        "assistant mask stored beside the tokens (train with data.kind=shards: the loss on the assistant's tokens)",
    )
    parser.add_argument("--max_tokens", type=int, default=0, help="--chat: cut at a turn boundary to this many tokens")
    args = parser.parse_args(argv)
    with user_errors():
        summary = prepare(
            [p for flag in args.input for p in flag.split(",") if p],
            args.output,
            tokenizer=args.tokenizer,
            fmt=args.format,
            delimiter=codecs.decode(args.delimiter, "unicode_escape"),
            field=args.field,
            vocab_size=args.vocab_size,
            sample_mb=args.sample_mb,
            valid_fraction=args.valid_fraction,
            shard_mb=args.shard_mb,
            workers=args.workers,
            chat=args.chat,
            max_tokens=args.max_tokens,
        )
    preemption.complete()  # DIR is in place: a signal from here on is no reason to retry
    print(json.dumps(summary))
