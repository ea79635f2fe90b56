"""`run.py generate`: continue a prompt (LM) or translate a source (encoder-decoder) from a workdir."""

from __future__ import annotations

import argparse
import math
import sys

from txjax.config import ConfigError, base_config, user_errors
from txjax.decode import generate_from_workdir, strategy_from_config
from txjax.decode.strategy import METHOD_OPTIONS, METHODS
from txjax.decode.stream import stream_from_workdir, streams
from txjax.experiment import load_workdir
from txjax.families import family_of
from txjax.sections.train import SEED_MAX

OPTIONS = ("max_new_tokens", *(name for method in METHODS for name in METHOD_OPTIONS[method]))  # the flags of Strategy


def main(argv: list[str]) -> None:
    """run.py generate --workdir=DIR --prompt=TEXT [--method=greedy|sample|beam] [--temperature --top_k --top_p
    --num_samples (sample)] [--beam_size --length_penalty (beam)] [--max_new_tokens --seed] [--chat] [--speculative]:
    prints each output (--chat: the prompt is a user message in the model's chat template, the output its reply;
    --speculative: greedy drafted by the model's MTP modules, the same text, printed at its end).

    Defaults: the workdir config's `decode` section. Without --method, a sampling option (--temperature, ...) means
    --method=sample and a beam option means --method=beam; an option of another method than --method is an error.
    --temperature=0 is greedy (as in vLLM and llama.cpp): the same tokens as --method=greedy, top_k/top_p ignored.
    A translation is at most max_len tokens (a note says so when --max_new_tokens or the config asks for more).
    An LM's one output (greedy, or one sample) prints as it is generated, sliding past the context when
    --max_new_tokens needs it (a note says so first).
    """
    parser = argparse.ArgumentParser(
        prog="run.py generate", description=main.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--prompt", required=True, help="LM: the text to continue; encoder-decoder: the source")
    parser.add_argument("--method", choices=METHODS, default=None)
    defaults = base_config().decode  # each option's type from its default; None: the workdir's config.decode
    for name in OPTIONS:
        parser.add_argument(f"--{name}", type=type(defaults[name]), default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--average", type=int, default=1, help="the mean of the last N checkpoints' parameters")
    parser.add_argument("--chat", action="store_true", help="the prompt is a user message in the chat template")
    parser.add_argument(
        "--speculative",
        action="store_true",
        help="greedy, drafted by the model's MTP modules (model.mtp_depth > 0; txjax.decode.speculative): the same "
        "text, within the context, printed at its end",
    )
    args = vars(parser.parse_args(argv))
    if not 0 <= args["seed"] <= SEED_MAX:
        raise ConfigError(f"--seed={args['seed']} must be in [0, {SEED_MAX}] (a 64-bit seed)")
    with user_errors():
        run = load_workdir(args.pop("workdir"), average=args.pop("average"))
        prompt, seed, chat, speculative = (
            args.pop("prompt"),
            args.pop("seed"),
            args.pop("chat"),
            args.pop("speculative"),
        )
        strategy = strategy_from_config(run.config.decode, run.tokenizer.eos_id, **args)
        limit = family_of(run.model).output_limit(run.model.cfg)
        if strategy["max_new_tokens"] > limit:  # as eval decodes
            print(
                f"note: max_new_tokens={strategy['max_new_tokens']} is more than the output's context (max_len="
                f"{run.model.cfg.max_len}): at most {limit} tokens",
                file=sys.stderr,
            )
            args["max_new_tokens"] = strategy["max_new_tokens"] = limit
        if strategy.get("top_k", 0) > run.model.cfg.vocab_size:
            print(
                f"note: top_k={strategy['top_k']} is more than the vocabulary ({run.model.cfg.vocab_size} tokens): "
                "every token is kept, as with top_k=0",
                file=sys.stderr,
            )
        if speculative or not streams(run, strategy):
            texts = generate_from_workdir(run, prompt, seed=seed, chat=chat, speculative=speculative, **args)
            print("\n---------------\n".join(texts))
            return
        if strategy["max_new_tokens"] >= run.model.cfg.max_len:
            print(past_context(run.model.cfg.max_len, strategy["max_new_tokens"]), file=sys.stderr, flush=True)
        for piece in stream_from_workdir(run, prompt, seed=seed, chat=chat, **args):
            print(piece, end="", flush=True)
    print()


def past_context(max_len: int, max_new_tokens: int) -> str:
    """The note a generation longer than the context starts with."""
    keep = max_len // 2
    windows = 1 + math.ceil((max_new_tokens - 1) / (max_len - keep + 1))  # the first one: at least a token
    return (
        f"note: --max_new_tokens={max_new_tokens} runs past the context (max_len={max_len}): up to {windows} windows,"
        f" each token seeing at least the last {keep} tokens (txjax.decode.generate_windowed); the text prints as it"
        " comes, Ctrl-C stops"
    )
