"""Streaming generation: tokens as the compiled loop produces them, not all at the end.

The loop runs in chunks of steps, each a compiled call whose tokens the host reads back as it ends
(txjax.decode.search.stream_ids): no callback, thread or queue; a break, Ctrl-C or an error stops it between two
calls. `generate_stream` is the one-row API (ids, sliding past the context as generate_windowed does: the same
windows, from decode.generate.windowed_steps); `stream_from_workdir` the text pieces `run.py generate` prints as
they come.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

from txjax.decode.generate import windowed_steps
from txjax.decode.workdir import workdir_prompt
from txjax.families import family_of

WINDOW = 256  # stream_from_workdir: at most this many tokens are decoded together


def generate_stream(
    model, params, prompt: Sequence[int], *, max_new_tokens: int, seed: int = 0, pad_id: int | None = None, **strategy
) -> Iterator[int]:
    """The ids generate_windowed returns for one row (greedy or one sample), each chunk as soon as it is chosen;
    ends before EOS."""
    if strategy.get("method") == "beam" or strategy.get("num_samples", 1) != 1:
        raise ValueError("streaming gives one row: method greedy or sample with num_samples=1")
    eos_id = strategy.get("eos_id")
    chunks = windowed_steps(
        model, params, prompt, stream=True, max_new_tokens=max_new_tokens, seed=seed, pad_id=pad_id, **strategy
    )
    with contextlib.closing(chunks):
        for tokens_1xN in chunks:
            for token in tokens_1xN[0].tolist():
                if token == eos_id:
                    return
                yield token


def streams(run, strategy: dict) -> bool:
    """Whether `run.py generate` streams with these Strategy fields: one row (greedy or one sample) of a generation
    that slides past the context as generate_windowed does (Family.slides: an LM's continuation)."""
    return family_of(run.model).slides(strategy) and strategy.get("num_samples", 1) == 1


def stream_from_workdir(run, text: str, *, seed: int = 0, chat: bool = False, **overrides) -> Iterator[str]:
    """generate_from_workdir's one text (an LM, greedy or one sample), in pieces as the tokens come: the prompt
    first (unless chat), then the text each token adds. The tokens since the last newline (at most WINDOW of them)
    are decoded together, so a character split over byte tokens comes out whole and a piece keeps the space a
    SentencePiece token holds."""
    ids, shown, strategy = workdir_prompt(run, text, chat=chat, **overrides)
    tokenizer = run.tokenizer
    yield shown
    window, printed = [], 0  # the tokens decoded together, and the length of their text already out
    tokens = generate_stream(run.model, run.params, ids, pad_id=tokenizer.pad_id, seed=seed, **strategy)
    with contextlib.closing(tokens):  # closed with this one: generate_stream's loop stops
        for token in tokens:
            window.append(token)
            text = tokenizer.decode(window)
            if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the rest
                continue
            yield text[printed:]
            window, printed = ([], 0) if text.endswith("\n") or len(window) >= WINDOW else (window, len(text))
    if rest := tokenizer.decode(window)[printed:]:  # a sequence the generation left incomplete
        yield rest
