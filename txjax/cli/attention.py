"""`run.py attention`: PNG heatmaps of the attention weights a workdir's model computes on a text."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from txjax.config import user_errors
from txjax.evaluate.viz import attention_inputs, attention_maps
from txjax.experiment import load_workdir


def main(argv: list[str]) -> None:
    """run.py attention --workdir=DIR --text=TEXT [--target=TEXT] [--layer=N] [--head=N] [--out=FILE.png]

    Without --layer: one panel per layer, heads averaged (or --head's head); with it: one panel per head.
    An encoder-decoder reads --text as the source and --target as the target (default: its greedy translation),
    and writes FILE-encoder.png, FILE-decoder.png and FILE-cross.png.
    """
    parser = argparse.ArgumentParser(
        prog="run.py attention",
        description=main.__doc__,
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--text", required=True)
    parser.add_argument("--target", help="encoder-decoder: the target text (default: the model's translation)")
    parser.add_argument("--layer", type=int)
    parser.add_argument("--head", type=int)
    parser.add_argument("--out", help="PNG path (default: WORKDIR/attention.png)")
    args = parser.parse_args(argv)
    with user_errors():
        run = load_workdir(args.workdir)
        ids, target_ids = attention_inputs(run, args.text, args.target)
        out = args.out or Path(args.workdir) / "attention.png"
        files = attention_maps(
            run.model, run.params, run.tokenizer, ids, out, target_ids=target_ids, layer=args.layer, head=args.head
        )
    print(json.dumps({"files": [str(f) for f in files], "step": run.step}))
