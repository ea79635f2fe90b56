"""`run.py generate`: continue a prompt (LM) or translate a source (encoder-decoder) from a workdir."""

from __future__ import annotations

import argparse

from txjax.config import user_errors
from txjax.decode import generate_from_workdir
from txjax.decode.strategy import METHODS
from txjax.experiment import load_workdir


def main(argv: list[str]) -> None:
    """run.py generate --workdir=DIR --prompt=TEXT [--method=greedy|sample|beam] [--temperature --top_k --top_p
    --num_samples (sample)] [--beam_size --length_penalty (beam)] [--max_new_tokens --seed] [--chat]: prints each
    output (--chat: the prompt is a user message in the model's chat template, the output its reply).

    Defaults: the workdir config's `decode` section. Without --method, a sampling option (--temperature, ...) means
    --method=sample and a beam option means --method=beam; an option of another method than --method is an error.
    --temperature=0 is greedy (as in vLLM and llama.cpp): the same tokens as --method=greedy, top_k/top_p ignored.
    """
    parser = argparse.ArgumentParser(
        prog="run.py generate", description=main.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--prompt", required=True, help="LM: the text to continue; encoder-decoder: the source")
    parser.add_argument("--method", choices=METHODS, default=None)
    for name, kind in [
        ("max_new_tokens", int),
        ("temperature", float),
        ("top_k", int),
        ("top_p", float),
        ("beam_size", int),
        ("length_penalty", float),
        ("num_samples", int),
    ]:
        parser.add_argument(f"--{name}", type=kind, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--average", type=int, default=1, help="the mean of the last N checkpoints' parameters")
    parser.add_argument("--chat", action="store_true", help="the prompt is a user message in the chat template")
    args = vars(parser.parse_args(argv))
    with user_errors():
        run = load_workdir(args.pop("workdir"), average=args.pop("average"))
        texts = generate_from_workdir(run, args.pop("prompt"), **args)
    print("\n---------------\n".join(texts))
