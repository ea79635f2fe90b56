"""One `generate` for both model families, whole splits in fixed-shape batches (`decode_all`), and sampling past
the context (`generate_windowed`).

Translation is generation with a source: the family says what an input is (`Family.prompts`): an LM's inputs are
the prompts it continues; an encoder-decoder's are sources it encodes once, each target starting from BOS.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Generator, Sequence

import jax
import numpy as np

from txjax.decode.cache import for_decoding
from txjax.decode.search import generate_ids, stream_ids
from txjax.decode.speculative import speculative_ids
from txjax.decode.strategy import Strategy
from txjax.families import family_of
from txjax.model.models import DecoderLM


@dataclasses.dataclass
class Generation:
    """One entry per prompt and sample (prompt-major): generated ids (without EOS or anything after it), the
    score (sampling: sum of log-probs; beam: log P / lp(length)), whether EOS was produced, and the number of
    tokens the loop generated before every row had stopped (<= max_new_tokens)."""

    ids: list[list[int]]
    scores: np.ndarray
    stopped: list[bool]
    steps: int
    accepted: int = 0  # speculative decoding: the drafts accepted, every row summed (steps: its rounds)


def pad_batch(seqs: Sequence[Sequence[int]], pad_id: int, length: int | None = None, left: bool = False):
    """Id lists -> (int32 [B, length] padded with pad_id on the left or the right, lengths int32 [B])."""
    longest = max(map(len, seqs))
    if length is not None and length < longest:
        raise ValueError(f"padded length {length} is shorter than the longest sequence ({longest} tokens)")
    length = longest if length is None else length
    out_BxL = np.full((len(seqs), length), pad_id, np.int32)
    for row_L, s in zip(out_BxL, seqs):
        if len(s):
            (row_L[length - len(s) :] if left else row_L[: len(s)])[...] = s
    return out_BxL, np.array([len(s) for s in seqs], np.int32)


def check_inputs(seqs: Sequence[Sequence[int]], vocab_size: int, max_len: int, what: str, new_tokens: int = 1):
    """One-line ValueErrors for what would otherwise be a silent wrong answer: no prompt, an empty one, an id
    outside the vocab, or more positions than the context (P + new_tokens - 1 > max_len)."""
    if not len(seqs):
        raise ValueError(f"no {what}s given")
    for i, s in enumerate(seqs):
        if not len(s):
            raise ValueError(f"{what} {i} is empty: give at least one token")
        bad = [t for t in s if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"{what} {i} has token id {bad[0]} outside the vocab [0, {vocab_size})")
        if len(s) + new_tokens - 1 > max_len:
            if len(s) > max_len or new_tokens == 1:
                raise ValueError(
                    f"{what} {i} has {len(s)} tokens, more than the model's context max_len={max_len}: shorten it"
                )
            raise ValueError(
                f"{what} {i} of {len(s)} tokens + max_new_tokens={new_tokens} needs "
                f"{len(s) + new_tokens - 1} positions, more than the model's context max_len={max_len};"
                f" lower max_new_tokens to <= {max_len - len(s) + 1}"
            )


def _results(strategy: Strategy, tokens_CxT, scores_C, steps) -> Generation:
    """Cut each row at its first EOS."""
    ids, stopped = [], []
    for row in np.asarray(tokens_CxT).tolist():
        end = row.index(strategy.eos_id) if strategy.eos_id in row else len(row)
        ids.append(row[:end])
        stopped.append(end < len(row))
    return Generation(ids=ids, scores=np.asarray(scores_C), stopped=stopped, steps=int(steps))


def _run_to_end(steps: Generator):
    """What a generator returns, run to its end (its yields dropped): generate and generate_windowed from their
    streaming forms."""
    while True:
        try:
            next(steps)
        except StopIteration as end:
            return end.value


def generate(model, params, inputs: Sequence[Sequence[int]], **kwargs) -> Generation:
    """Generate from each input (a list of ids); `kwargs`: generation_steps' (bos_id, pad_id, length, seed) and the
    fields of Strategy.

    A DecoderLM continues its inputs (prompts, left-padded); an EncoderDecoder reads them as sources (ending with
    EOS as in training; right-padded) and generates each target from `bos_id`. The inputs are padded to `length`
    (default: the longest; fix it to compile once for many batches). Same seed, same text. Beam search returns the
    best hypothesis per input; sampling num_samples per input. A scanned model is decoded with its layers unrolled
    (`for_decoding`; pass its result to skip that copy).
    """
    return _run_to_end(generation_steps(model, params, inputs, **kwargs))


def generation_steps(
    model,
    params,
    inputs: Sequence[Sequence[int]],
    *,
    stream: bool = False,
    speculative: bool = False,
    bos_id: int | None = None,
    pad_id: int | None = None,
    length: int | None = None,
    seed: int = 0,
    **strategy,
) -> Generator[np.ndarray, None, Generation]:
    """`generate` as a generator returning its Generation: without `stream`, one compiled call (generate_ids) and
    no yield; with it (greedy or sampling), every chunk of tokens [C, n] as the compiled loop chooses them
    (search.stream_ids), EOS and the pad after a row stopped included. `speculative`: greedy decoding drafted by
    the model's MTP modules (txjax.decode.speculative; the same tokens), in one call."""
    strategy = Strategy(**strategy)
    cfg = model.cfg
    prompts, sources = family_of(model).prompts(inputs, bos_id)
    pad_id = 0 if pad_id is None else pad_id
    source = None
    if sources is not None:
        check_inputs(sources, cfg.vocab_size, cfg.max_len, "source")
        source, length = pad_batch(sources, pad_id, length), None  # `length` pads the inputs: here, the sources
    check_inputs(prompts, cfg.vocab_size, cfg.max_len, "prompt", strategy.max_new_tokens)
    prompt_BxP, lengths_B = pad_batch(prompts, pad_id, length, left=True)
    if speculative:
        if stream:
            raise ValueError("speculative decoding's tokens come in one call: stream=False")
        tokens_BxT, scores_B, rounds, accepted = speculative_ids(model, params, strategy, prompt_BxP, lengths_B)
        return dataclasses.replace(_results(strategy, tokens_BxT, scores_B, rounds), accepted=int(accepted))
    model, params = for_decoding(model, params, len(inputs) * strategy.rows_per_prompt)
    args = (model, params, strategy, pad_id, prompt_BxP, lengths_B, source, jax.random.key(seed))
    out = (yield from stream_ids(*args)) if stream else generate_ids(*args)
    return _results(strategy, *out)


def decode_all(model, params, inputs: Sequence[Sequence[int]], *, batch_size: int, **kwargs) -> Generation:
    """`generate` over many inputs in fixed-shape batches: one
    compilation for the whole list. Inputs are sorted by length (rows that stop together share a batch, so the
    loop exits early), the last batch is filled by repeating an input; results come back in input order, one per
    input (so no num_samples)."""
    if kwargs.get("num_samples", 1) != 1:
        raise ValueError("decode_all gives one output per input: num_samples must be 1")
    batch_size = min(batch_size, len(inputs))
    strategy = Strategy(**{f.name: kwargs[f.name] for f in dataclasses.fields(Strategy) if f.name in kwargs})
    model, params = for_decoding(model, params, batch_size * strategy.rows_per_prompt)
    order = sorted(range(len(inputs)), key=lambda i: len(inputs[i]))
    outs = []
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        batch = [inputs[i] for i in rows + rows[-1:] * (batch_size - len(rows))]
        outs.append((rows, generate(model, params, batch, length=max(map(len, inputs)), **kwargs)))
    ids, stopped, scores = [None] * len(inputs), [None] * len(inputs), np.zeros(len(inputs), np.float32)
    for rows, out in outs:
        for j, i in enumerate(rows):
            ids[i], stopped[i], scores[i] = out.ids[j], out.stopped[j], out.scores[j]
    return Generation(ids=ids, scores=scores, stopped=stopped, steps=max(out.steps for _, out in outs))


def generate_windowed(model: DecoderLM, params, prompt: Sequence[int], **kwargs) -> list[list[int]]:
    """Sampling beyond the model's context (nanoGPT's sample.py crops the sequence to its last max_len tokens):
    generate until the sequence fills the context, then restart from its last `keep` tokens (default max_len // 2)
    with a fresh cache, and so on; every token sees at least `keep` tokens of context (all of them while they fit,
    which is plain `generate`). A longer prompt is cropped to its last max_len tokens. Returns the continuations
    (num_samples of them when sampling; ids, cut at EOS). Windows after the first have one shape: at most three
    compilations. `kwargs`: windowed_steps' (max_new_tokens, keep, seed, pad_id) and the fields of Strategy."""
    return _run_to_end(windowed_steps(model, params, prompt, **kwargs))


def windowed_steps(
    model: DecoderLM,
    params,
    prompt: Sequence[int],
    *,
    max_new_tokens: int,
    stream: bool = False,
    keep: int | None = None,
    seed: int = 0,
    pad_id: int | None = None,
    **strategy,
) -> Generator[np.ndarray, None, list[list[int]]]:
    """`generate_windowed` as a generator returning its continuations; with `stream`, yields each window's chunks
    of tokens [C, n] as generation_steps does (a row that stopped in an earlier window: what it would add, dropped
    from the result)."""
    max_len = model.cfg.max_len
    keep = keep or max_len // 2
    if not 0 < keep < max_len:
        raise ValueError(f"keep={keep} must be in [1, {max_len - 1}] (the context is max_len={max_len})")
    prompt = list(prompt)[-max_len:]
    model, params = for_decoding(model, params, Strategy(max_new_tokens, **strategy).rows_per_prompt)
    window = functools.partial(generation_steps, model, params, stream=stream, pad_id=pad_id)
    new = min(max_new_tokens, max_len - len(prompt) + 1)
    out = yield from window([prompt], max_new_tokens=new, seed=seed, **strategy)
    one_each = {k: v for k, v in strategy.items() if k != "num_samples"}  # later windows: one row per sample
    seqs, stopped, generated = [prompt + ids for ids in out.ids], list(out.stopped), [list(ids) for ids in out.ids]
    for index in itertools.count(1):
        remaining = max_new_tokens - max(map(len, generated))
        if remaining <= 0 or all(stopped):
            break
        new = min(remaining, max_len - keep + 1)
        out = yield from window([s[-keep:] for s in seqs], max_new_tokens=new, seed=seed + index, **one_each)
        for i, ids in enumerate(out.ids):
            if not stopped[i]:  # a stopped row's continuation is computed (fixed shapes) and dropped
                seqs[i] = (seqs[i] + ids)[-keep:]
                generated[i] += ids
                stopped[i] = out.stopped[i]
    return generated
