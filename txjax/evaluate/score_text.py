"""Score a text with a language model: how well it predicts the text's tokens, in units that compare across
tokenizers (`run.py eval --workdir=DIR --text=FILE`).

The text's tokens (after BOS when the model expects one) are cut into non-overlapping windows of the model's
context (txjax.data.text.eval_windows: every token but the first predicted exactly once, each from the tokens before
it in its window) and run through the jitted eval step (txjax.evaluate.split):

    loss = sum_t CE_t / T  (nats per token),  perplexity = exp(loss),
    nats_per_char = sum_t CE_t / C,  bits_per_byte = sum_t CE_t / (B ln 2)

with C characters and B UTF-8 bytes of the text the T scored tokens decode to. A character model's loss is its
nats/char, so a BPE model and a character model are compared on the same text by nats_per_char.

The file is read, tokenized and scored piece by piece (txjax.data.files.text_pieces, text.encode_pieces): memory
holds a piece of text and a batch of windows, whatever the file's size, and the tokens are those of the whole text.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator

import numpy as np
from jax.sharding import Mesh

from txjax.data.files import PathLike, text_pieces
from txjax.data.text import encode_pieces, eval_windows
from txjax.evaluate.split import evaluate, global_batches, make_eval_step


def score_tokens(model, params, ids, *, context: int, batch_size: int, mesh: Mesh | None = None) -> dict:
    """evaluate()'s loss, perplexity, token_accuracy, tokens over `ids` in windows of `context` tokens."""
    return score_pieces(model, params, [np.asarray(ids, np.int32)], context=context, batch_size=batch_size, mesh=mesh)


def score_pieces(
    model, params, pieces: Iterable[np.ndarray], *, context: int, batch_size: int, mesh: Mesh | None = None
) -> dict:
    """score_tokens over the tokens that `pieces` (arrays of ids) make up, read as the windows need them; the window
    is `context` tokens, or all but one of them when there are fewer."""
    pieces = iter(pieces)
    head = np.zeros(0, np.int32)
    for piece in pieces:
        head = np.concatenate([head, piece])
        if len(head) > context:
            break
    if len(head) < 2:
        raise ValueError(f"the text has {len(head)} token(s); scoring needs at least 2")
    windows = eval_windows(itertools.chain([head], pieces), min(context, len(head) - 1), batch_size)
    return evaluate(make_eval_step(model, mesh), params, global_batches(windows, batch_size, mesh=mesh))


def score_text(
    run,
    path: PathLike,
    *,
    max_tokens: int = 0,
    context: int = 0,
    batch_size: int = 0,
    mesh: Mesh | None = None,
    piece_chars: int = 1 << 20,
) -> dict:
    """Metrics of a loaded run (txjax.experiment.load_workdir) on the UTF-8 text file `path`: its first max_tokens
    tokens if > 0, in windows of `context` tokens (0: the model's max_len), `batch_size` windows per step (0: about the
    tokens of a training batch), the file read `piece_chars` characters at a time."""
    tokenizer, cfg = run.tokenizer, run.model.cfg
    context = min(context or cfg.max_len, cfg.max_len)
    training_tokens = run.config.train.batch_size * run.config.data.seq_len
    batch_size = batch_size or max(1, training_tokens // context)
    text = encode_pieces(tokenizer, text_pieces(path, piece_chars))
    pieces = itertools.chain([np.asarray(tokenizer.prefix(), np.int32)], text)
    pieces = _first(pieces, max_tokens + 1) if max_tokens > 0 else pieces
    counts = {"characters": 0, "bytes": 0}
    scored = _count_scored(tokenizer, pieces, counts)
    metrics = score_pieces(run.model, run.params, scored, context=context, batch_size=batch_size, mesh=mesh)
    nats = metrics["loss"] * metrics["tokens"]
    return {
        **metrics,
        **counts,
        "nats_per_char": nats / max(counts["characters"], 1),
        "bits_per_byte": nats / math.log(2) / max(counts["bytes"], 1),
        "context": context,
    }


def _first(pieces: Iterable[np.ndarray], limit: int) -> Iterator[np.ndarray]:
    """The pieces up to `limit` tokens in all; nothing beyond is read."""
    left = limit
    for piece in pieces:
        yield piece[: min(left, len(piece))]
        left -= len(piece)
        if left <= 0:
            return


def _count_scored(tokenizer, pieces: Iterable[np.ndarray], counts: dict) -> Iterator[np.ndarray]:
    """The pieces, counting into `counts` the characters and UTF-8 bytes that all their tokens but the first decode
    to: each piece is decoded after the last tokens before it, whose own text is subtracted (a decoder drops a leading
    space only at a text's start)."""
    before = None  # the last scored tokens; None until the first token has gone by
    for piece in pieces:
        scored = piece
        if before is None and len(piece):
            scored, before = piece[1:], []
        if len(scored):
            text, context = tokenizer.decode([*before, *scored.tolist()]), tokenizer.decode(before)
            counts["characters"] += len(text) - len(context)
            counts["bytes"] += len(text.encode("utf-8")) - len(context.encode("utf-8"))
            before = [*before, *scored[-8:].tolist()][-8:]
        yield piece
