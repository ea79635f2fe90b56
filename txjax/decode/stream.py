"""Streaming generation: tokens as the compiled loop produces them, not all at the end.

The loop is the one `generate` compiles (with stream=True each step's tokens also leave it through an ordered
host callback: one compilation, and the same tokens as without it); `stream_steps` runs a generation in a thread
and yields every step's tokens from a queue. `generate_stream` is the one-row API (ids, sliding past the context as
generate_windowed does); `stream_from_workdir` the text pieces `run.py generate` prints as they come. Closing the
iterator (a break, Ctrl-C) stops the loop at its next step.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Iterator, Sequence

from txjax.decode.generate import generate_windowed
from txjax.decode.search import listening
from txjax.decode.workdir import workdir_prompt
from txjax.families import family_of

_END = object()
CALLBACK_LOGGER = "jax._src.callback"  # where jax reports a host callback's error
STEPS_AHEAD = 1024  # the most steps a loop runs ahead of the reader (then it waits)
WINDOW = 256  # stream_from_workdir: at most this many tokens are decoded together


def stream_steps(run: Callable[[], object]) -> Iterator[list[int]]:
    """Runs `run()` (generate / generate_windowed calls) in a thread; yields each step's tokens, one per row, as the
    compiled loops produce them (they wait for a reader STEPS_AHEAD behind). `run`'s error is raised here, after
    the tokens it produced."""
    steps, closed, outcome = queue.Queue(STEPS_AHEAD), threading.Event(), {}

    def put(item) -> bool:  # waits while the reader is STEPS_AHEAD steps behind; False once it closed the stream
        while not closed.is_set():
            with contextlib.suppress(queue.Full):
                steps.put(item, timeout=0.05)
                return True
        return False

    def listener(tokens_C):
        if not put(tokens_C.tolist()):  # raised inside the compiled loop: it ends at this step
            raise RuntimeError("the stream was closed")

    def target():
        try:
            with listening(listener):
                run()
        except Exception as e:
            outcome["error"] = e
        finally:
            put(_END)

    thread = threading.Thread(target=target, name="generate", daemon=True)
    thread.start()
    try:
        while (tokens := steps.get()) is not _END:
            yield tokens
    finally:
        quiet = lambda record: not closed.is_set()  # jax logs the listener's error with a traceback: not ours
        logging.getLogger(CALLBACK_LOGGER).addFilter(quiet)
        closed.set()
        thread.join()
        logging.getLogger(CALLBACK_LOGGER).removeFilter(quiet)
    if "error" in outcome:
        raise outcome["error"]


def generate_stream(
    model, params, prompt: Sequence[int], *, max_new_tokens: int, seed: int = 0, pad_id: int | None = None, **strategy
) -> Iterator[int]:
    """The ids generate_windowed returns for one row (greedy or one sample), each as soon as it is chosen; ends
    before EOS."""
    if strategy.get("method") == "beam" or strategy.get("num_samples", 1) != 1:
        raise ValueError("streaming gives one row: method greedy or sample with num_samples=1")
    eos_id = strategy.get("eos_id")
    run = lambda: generate_windowed(
        model, params, prompt, max_new_tokens=max_new_tokens, seed=seed, pad_id=pad_id, **strategy
    )
    with contextlib.closing(stream_steps(run)) as steps:  # its thread stopped when this one closes
        for (token,) in steps:
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
    with contextlib.closing(tokens):  # closed with this one: generate_stream's thread stops
        for token in tokens:
            window.append(token)
            text = tokenizer.decode(window)
            if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the rest
                continue
            yield text[printed:]
            window, printed = ([], 0) if text.endswith("\n") or len(window) >= WINDOW else (window, len(text))
    if rest := tokenizer.decode(window)[printed:]:  # a sequence the generation left incomplete
        yield rest
