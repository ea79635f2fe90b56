"""`run.py eval`: evaluate a workdir's latest checkpoint on a whole split."""

from __future__ import annotations

import argparse
import functools
import json
import sys

import jax

from txjax import config as config_lib
from txjax import families
from txjax.cli import add_distributed_flags, initialize_distributed, parse_with_overrides
from txjax.config import ConfigError, user_errors
from txjax.data import KINDS, resolve_path
from txjax.evaluate.score_text import score_text
from txjax.evaluate.split import split_metrics, write_metrics
from txjax.experiment import build_dataset, build_model, load_workdir
from txjax.families import init_params
from txjax.ops import storage
from txjax.parallel import distributed


def main(argv: list[str]) -> None:
    """run.py eval --workdir=DIR [--split=valid|test | --text=FILE [--max_tokens=N] [--context=N]] [--average=N]
    [--config.mesh.FIELD=N ...] [--config.decode.FIELD=V ...]: prints the metrics as the last line on stdout and
    writes them to DIR/eval_<split>.json (--text: eval_text.json; a workdir that cannot be written: a warning line).
    --average=N evaluates the mean of the parameters of the last N checkpoints (their steps recorded as
    averaged_steps). The parameters are laid out on the run's mesh (on one device when this machine has fewer
    devices than it needs) unless --config.mesh.* flags choose another; a translation is decoded with the run's
    decode section, --config.decode.* flags changing its fields (e.g. length_penalty); --config.decode.prefill_chunk=N
    feeds any split's prompts N tokens at a time (a long-context task's eval in bounded memory).
    --config.model.FIELD=V and --config.data.seq_len=N evaluate the checkpoint's parameters in a changed model, one
    whose parameters keep their shapes: a longer context (model.max_len with data.seq_len), another RoPE scaling
    (model.rope_scaling, rope_factor, ...), another attention implementation. --by_position=W also reports the loss
    per bucket of W positions (txjax.evaluate.split)."""
    parser = argparse.ArgumentParser(prog="run.py eval", description=main.__doc__, allow_abbrev=False)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--split", default="valid", choices=("valid", "test"))
    parser.add_argument(
        "--text", help="score this text file instead (txjax.evaluate.score_text): loss, nats/char, bits/byte"
    )
    parser.add_argument("--max_tokens", type=int, default=0, help="--text: its first N tokens only (0: all)")
    parser.add_argument("--context", type=int, default=0, help="--text: tokens per window (0: the model's max_len)")
    parser.add_argument("--average", type=int, default=1, help="the mean of the last N checkpoints' parameters")
    parser.add_argument("--by_position", type=int, default=0, help="--split: the loss per bucket of N positions too")
    add_distributed_flags(parser)
    model_flags = ("--config.model.", "--config.data.seq_len=")  # the model changed for this eval (changed_model)
    args, overrides = parse_with_overrides(parser, argv, prefix=("--config.mesh.", *model_flags, "--config.decode."))
    if args.by_position < 0 or (args.by_position and args.text):
        raise ConfigError(f"--by_position={args.by_position}: a bucket width > 0, with --split (not --text)")
    initialize_distributed(args)
    saved, config = config_lib.load(args.workdir), config_lib.load(args.workdir)
    for flag in overrides:
        config_lib.apply_override(config, flag)
    config_lib.validate(config, saved)  # a bad decode field is one line here, not a traceback from the decoder
    if args.text:  # an encoder-decoder or a prefix LM writes a new text from a source: a text alone has no meaning
        fix = " (a text alone is no source for it): evaluate its pairs with --split=valid or --split=test"
        families.get(config.family).check_scores_text(args.workdir, "--text", fix)
    mesh_given = any(flag.startswith("--config.mesh.") for flag in overrides)
    mesh = (distributed.run_mesh if mesh_given else distributed.fitting_mesh)(config.mesh)
    decode_given = [flag.partition("=")[0].split(".")[-1] for flag in overrides if flag.startswith("--config.decode.")]
    choices = [name for name in decode_given if args.text or name != "prefill_chunk"]  # how a prompt is fed: any split
    if choices and (args.text or not KINDS[config.data.kind].translates):  # nothing would read them: say so
        task = "--text is scored, not decoded" if args.text else f"a {config.data.kind} task decodes greedily"
        raise ConfigError(f"--config.decode.{choices[0]}: only a translation split is decoded ({task}): drop it")
    strategy = {name: config.decode[name] for name in decode_given}  # over the run's decode section
    with user_errors():
        run = load_workdir(args.workdir, mesh=mesh, average=args.average)
        changed = [flag for flag in overrides if flag.startswith(model_flags)]
        if changed:
            run = changed_model(run, config, changed)
        if args.text:  # a missing, short or unencodable text is a one-line error
            path = resolve_path(args.text, "text file", "--text")
            score = score_text(run, path, max_tokens=args.max_tokens, context=args.context, mesh=mesh)
            metrics = {"text": args.text, "step": run.step, **score}
        else:
            dataset = build_dataset(run.config, run.tokenizer, args.split)
    if not args.text:
        metrics = split_metrics(run, dataset, mesh, by_position=args.by_position, **strategy)
        metrics = {"split": args.split, "step": run.step, **metrics}
    if run.averaged_steps:
        metrics["averaged_steps"] = list(run.averaged_steps)
    if distributed.is_lead():
        print(json.dumps(metrics))  # first: a workdir that cannot be written still shows the result
        try:
            write_metrics(args.workdir, "text" if args.text else args.split, metrics)
        except OSError as e:
            if storage.cause(e) is None:
                raise
            print(f"warning: the result above is not saved ({e.filename}: {storage.reason(e)})", file=sys.stderr)


def changed_model(run, config, flags: list[str]):
    """The loaded run with the model and data.seq_len of `config` (changed by `flags`), its parameters as trained; a
    change that would give the model other parameters, or a context beyond model.max_len, is refused."""
    if config.data.seq_len > config.model.max_len:
        raise ConfigError(
            f"--config.data.seq_len={config.data.seq_len} exceeds model.max_len={config.model.max_len}: "
            f"add --config.model.max_len={config.data.seq_len}"
        )
    model = build_model(config)
    shapes = jax.eval_shape(functools.partial(init_params, model, jax.random.key(0)))
    if jax.tree.map(lambda x: x.shape, shapes) != jax.tree.map(lambda x: x.shape, run.params):
        raise ConfigError(
            f"{' '.join(flags)}: changes the shapes of the model's parameters; evaluate fields that keep them"
        )
    return run._replace(config=config, model=model)
