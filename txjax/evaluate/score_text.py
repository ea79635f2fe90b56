"""Score a text with a language model: how well it predicts the text's tokens, in units that compare across
tokenizers (`run.py eval --workdir=DIR --text=FILE`).

The text is tokenized whole (after BOS when the model expects one), cut into non-overlapping windows of the
model's context (TextLMDataset's eval windows: every token but the first predicted exactly once, each from the
tokens before it in its window) and run through the jitted eval step (txjax.evaluate.split):

    loss = sum_t CE_t / T  (nats per token),  perplexity = exp(loss),
    nats_per_char = sum_t CE_t / C,  bits_per_byte = sum_t CE_t / (B ln 2)

with C characters and B UTF-8 bytes of the text the T scored tokens decode to. A character model's loss is its
nats/char, so a BPE model and a character model are compared on the same text by nats_per_char.
"""

from __future__ import annotations

import math

import numpy as np
from jax.sharding import Mesh

from txjax.data import TextLMDataset
from txjax.evaluate.split import eval_batches, evaluate, make_eval_step


def score_tokens(model, params, ids, *, context: int, batch_size: int, mesh: Mesh | None = None) -> dict:
    """evaluate()'s loss, perplexity, token_accuracy, tokens over `ids` in windows of `context` tokens."""
    if len(ids) < 2:
        raise ValueError(f"the text has {len(ids)} token(s); scoring needs at least 2")
    dataset = TextLMDataset.from_tokens(np.asarray(ids), min(context, len(ids) - 1))
    return evaluate(make_eval_step(model, mesh), params, eval_batches(dataset, batch_size, mesh=mesh))


def score_text(
    run, text: str, *, max_tokens: int = 0, context: int = 0, batch_size: int = 0, mesh: Mesh | None = None
) -> dict:
    """Metrics of a loaded run (txjax.experiment.load_workdir) on `text`: its first max_tokens tokens if > 0, in
    windows of `context` tokens (0: the model's max_len), `batch_size` windows per step (0: about the tokens of a
    training batch)."""
    tokenizer, cfg = run.tokenizer, run.model.cfg
    ids = tokenizer.prefix() + tokenizer.encode(text)
    if max_tokens > 0:
        ids = ids[: max_tokens + 1]
    context = min(context or cfg.max_len, cfg.max_len)
    training_tokens = run.config.train.batch_size * run.config.data.seq_len
    batch_size = batch_size or max(1, training_tokens // context)
    metrics = score_tokens(run.model, run.params, ids, context=context, batch_size=batch_size, mesh=mesh)
    scored = tokenizer.decode(ids[1:])
    nats = metrics["loss"] * metrics["tokens"]
    return {
        **metrics,
        "characters": len(scored),
        "bytes": len(scored.encode("utf-8")),
        "nats_per_char": nats / max(len(scored), 1),
        "bits_per_byte": nats / math.log(2) / max(len(scored.encode("utf-8")), 1),
        "context": context,
    }
