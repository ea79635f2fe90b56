"""`run.py lm-eval`: a workdir's language model on lm-evaluation-harness tasks (txjax.evaluate.lm_eval_model)."""

from __future__ import annotations

import argparse
import json
import math
import shlex
from pathlib import Path

from txjax.config import ConfigError, user_errors
from txjax.evaluate.lm_eval_tasks import load_tasks, task_manager
from txjax.extras import require
from txjax.ops import storage


def harness_command(args) -> str:
    """The same evaluation through the harness's own CLI (with the txjax model registered)."""
    flags = ["--model", "txjax", "--model_args", f"workdir={args.workdir}", "--tasks", args.tasks]
    for name in ("num_fewshot", "include_path", "limit", "batch_size", "output"):
        if getattr(args, name) is not None:
            flags += [f"--{name}" if name != "output" else "--output_path", str(getattr(args, name))]
    return shlex.join(["python", "-m", "txjax.evaluate.lm_eval_model", *flags])


def check_flags(args) -> None:
    """The numeric flags in range (the harness takes --limit 0 as no documents and --num_fewshot -1 as given)."""
    if args.limit is not None and not (0 < args.limit < 1 or (1 <= args.limit < math.inf and args.limit.is_integer())):
        raise ConfigError(
            f"--limit={args.limit:g}: give a number of documents (1, 2, ...) or a fraction of each task in (0, 1)"
        )
    if args.num_fewshot is not None and args.num_fewshot < 0:
        raise ConfigError(f"--num_fewshot={args.num_fewshot} must be >= 0 (examples put before each question)")
    if args.max_length is not None and args.max_length < 2:
        raise ConfigError(f"--max_length={args.max_length} must be >= 2 (tokens of context)")


def main(argv: list[str]) -> None:
    """run.py lm-eval --workdir=DIR --tasks=T1,T2 [--num_fewshot=N] [--include_path=DIR] [--limit=N]
    [--batch_size=auto|N] [--max_length=N] [--output=FILE]: prints the harness's results table, then one JSON line
    (the results, txjax's scoring speed, the equivalent harness command); --output writes the harness's results
    JSON there."""
    parser = argparse.ArgumentParser(prog="run.py lm-eval", description=main.__doc__, allow_abbrev=False)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--tasks", required=True, help="comma-separated harness task names")
    parser.add_argument("--num_fewshot", type=int, default=None)
    parser.add_argument("--include_path", default=None, help="a folder of task YAMLs (the harness's flag)")
    parser.add_argument("--limit", type=float, default=None, help="the first N documents of each task")
    parser.add_argument("--batch_size", default="auto", help="rows per batch, or auto (about 2048 tokens)")
    parser.add_argument("--max_length", type=int, default=None, help="context in tokens (default: the model's)")
    parser.add_argument("--output", default=None, help="write the harness's results JSON here")
    args = parser.parse_args(argv)
    lm_eval = require("lm_eval", "run.py lm-eval")
    from lm_eval.utils import handle_non_serializable, make_table

    from txjax.evaluate.lm_eval_model import TxjaxLM

    if args.include_path and not Path(args.include_path).is_dir():
        raise ConfigError(f"--include_path={args.include_path} is not a folder: give the folder of your task YAMLs")
    if args.batch_size != "auto" and not (args.batch_size.isdigit() and int(args.batch_size) > 0):
        raise ConfigError(f"--batch_size={args.batch_size}: give a positive number of rows or auto")
    check_flags(args)
    names = [name for name in args.tasks.split(",") if name]
    manager = task_manager(names, args.include_path)
    load_tasks(manager, names)
    with user_errors():
        lm = TxjaxLM(workdir=args.workdir, batch_size=args.batch_size, max_length=args.max_length)
    limit = int(args.limit) if args.limit is not None and args.limit >= 1 else args.limit
    with user_errors():  # a document the workdir's tokenizer cannot encode: one line
        results = lm_eval.simple_evaluate(
            model=lm, tasks=names, num_fewshot=args.num_fewshot, limit=limit, task_manager=manager, log_samples=False
        )
    print(make_table(results))
    if results.get("groups"):
        print(make_table(results, "groups"))
    speed = lm.speed()
    line = {"results": results["results"], "txjax": speed, "harness": harness_command(args)}
    print(json.dumps(line, default=handle_non_serializable), flush=True)  # first: shown if --output cannot be written
    if args.output:
        out = json.dumps({**results, "txjax": speed}, indent=1, default=handle_non_serializable) + "\n"
        with storage.writing(f"--output={args.output}", "the results are printed above; give a writable --output"):
            storage.replace_file(args.output, out)  # whole or not at all
