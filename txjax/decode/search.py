"""The compiled generation loop: prefill, then feed-and-choose inside lax.while_loops, one per cache length.

A pure `tokens_to_logits(tokens_C, positions_C, cache) -> (logits_CxV, cache)` closure (Flax wmt/lm1b style) runs
for the whole generation (no host round trip per token, one compilation whatever the length). The cache starts at
the smallest of a few bucketed lengths that holds the prompt and grows to the next when full
(`cache.bucket_lengths`), so a step's attention reads about the filled slots, not the whole capacity; a strategy's
`update(state, logits_CxV, cache) -> (state, cache)` picks the next tokens (sampling.sample_update or
beam.beam_update). Both stop a row at `eos_id` and leave the loop early once every row has stopped.
"""

from __future__ import annotations

import contextlib
import functools
import threading

import einops
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

from txjax.decode.beam import beam_update, init_beam_state
from txjax.decode.cache import bucket_lengths, extend, filled, gather_rows, grow, init_cache, tile_rows
from txjax.decode.sampling import init_sample_state, sample_update
from txjax.decode.strategy import Strategy
from txjax.families import family_of

_listeners: dict[int, object] = {}  # key -> the function a streamed loop's steps go to (txjax.decode.stream)
_thread = threading.local()  # .key: the listener of the generations this thread runs


@contextlib.contextmanager
def listening(listener):
    """The loops this thread runs inside (generate_ids(stream=True)) call listener(tokens_C) with every step's
    tokens, one per row, as they are produced (an ordered host callback, told the key of its listener)."""
    key = max(_listeners, default=0) + 1
    _listeners[key], _thread.key = listener, key
    try:
        yield
    finally:
        del _listeners[key]
        _thread.key = None


def listener_key() -> int | None:
    """The key of this thread's listener (None: not streaming)."""
    return getattr(_thread, "key", None)


def _emit(key, tokens_C) -> None:
    _listeners[int(key)](np.asarray(tokens_C))


def search(tokens_to_logits, update, state, first_logits_CxV, cache, start_positions_C, max_new_tokens: int, lengths):
    """Choose from the prefill logits, then feed-and-choose until max_new_tokens or `done`: one lax.while_loop per
    cache length in `lengths` (ascending, the first at least the cache's; a cache that never grows: its own length
    alone), the cache grown to each before its loop.

    The token chosen at step s (0-based) sits at position start + s; it is fed back only if another is needed.
    """
    state, cache = update(state, first_logits_CxV, cache)

    def body(carry):
        state, cache = carry
        logits_CxV, cache = tokens_to_logits(state.last_C, start_positions_C + state.step - 1, cache)
        return update(state, logits_CxV, cache)

    for length in lengths:
        cache = grow(cache, length)

        def cond(carry, length=length):
            state, cache = carry
            room = filled(cache) < length  # a free slot for the token fed next
            return (state.step < max_new_tokens) & ~state.done & room

        state, cache = jax.lax.while_loop(cond, body, (state, cache))
    return state


def pad_to_chunks(fed, chunk: int | None):
    """The prompt's (tokens, positions, segment ids) [B, P] left-padded to a multiple of `chunk` tokens (None or one
    chunk: as they are): the pad slots are segment 0, which the cache stores as empty, so the rows generate what they
    would unpadded."""
    length = fed[0].shape[1]
    pad = -length % chunk if chunk and chunk < length else 0
    return fed if not pad else tuple(jnp.pad(t, ((0, 0), (pad, 0))) for t in fed)


def prefill_in_chunks(model, params, cache, fed, context, chunk: int | None):
    """`extend` over the prompt (padded by pad_to_chunks) `chunk` tokens at a time (None: one call): the first chunk
    is the generation's first call (an encoder-decoder caches its cross-attention keys/values there), the others a
    lax.scan (one compiled call whatever the prompt's length); each chunk's queries attend over the cache written so
    far, so attention holds chunk x cache scores instead of prompt x cache.
    -> (the last token's logits [B, V], cache)."""
    if not chunk or chunk >= fed[0].shape[1]:
        return extend(model, params, cache, *fed, context=context, prefill=True)
    _, cache = extend(model, params, cache, *(t[:, :chunk] for t in fed), context=context, prefill=True)

    def step(cache, chunk_inputs):
        logits_BxV, cache = extend(model, params, cache, *chunk_inputs, context=context)
        return cache, logits_BxV

    chunks = [einops.rearrange(t[:, chunk:], "b (n c) -> n b c", c=chunk) for t in fed]
    cache, logits_NxBxV = jax.lax.scan(step, cache, chunks)
    return logits_NxBxV[-1], cache


def _emitting(update, listener, state, logits_CxV, cache):
    state, cache = update(state, logits_CxV, cache)
    io_callback(_emit, None, listener, state.last_C, ordered=True)
    return state, cache


@functools.partial(jax.jit, static_argnums=(0, 2, 3), static_argnames=("first_bucket", "stream"))
def generate_ids(
    model,
    params,
    strategy: Strategy,
    pad_id: int,
    prompt_BxP,
    lengths_B,
    source,
    rng,
    first_bucket=64,
    stream=False,
    listener=0,
):
    """Left-padded prompts [B, P] (real tokens last) with their lengths [B], and the sources the family encodes
    ((right-padded ids [B, S], lengths [B]); an LM: None) -> (tokens [B*W', T], scores [B*W'], steps) in one
    compiled call, W' = num_samples for sampling and 1 (the best hypothesis) for beam search; steps: loop steps taken.

    The prompts fill the cache in one call (positions start at 0 at each row's first real token and pad slots are
    segment 0, stored as empty, so each row generates what it would alone); the cache is tiled to W rows per input
    (beams or samples); then `search` runs with the one `tokens_to_logits` closure, growing the cache from
    `first_bucket` slots. stream (sampling and greedy): each step's tokens also go to the `listening` listener of
    key `listener` (traced: one compilation for every stream) as they are chosen.
    """
    (b, p), w = prompt_BxP.shape, strategy.rows_per_prompt
    context = family_of(model).encode(model, params, source)
    first_real_B = p - lengths_B
    positions_BxP = jnp.maximum(jnp.arange(p)[None, :] - first_real_B[:, None], 0)
    segment_ids_BxP = (jnp.arange(p)[None, :] >= first_real_B[:, None]).astype(jnp.int32)
    fed = pad_to_chunks((prompt_BxP, positions_BxP, segment_ids_BxP), strategy.prefill_chunk)
    filled_p = fed[0].shape[1]
    lengths = bucket_lengths(filled_p, filled_p + strategy.max_new_tokens - 1, first_bucket)
    cache = init_cache(model, b, lengths[0], None if source is None else source[0].shape[1])
    first_logits_BxV, cache = prefill_in_chunks(model, params, cache, fed, context, strategy.prefill_chunk)
    if w > 1:
        cache = gather_rows(cache, jnp.repeat(jnp.arange(b), w))
    context_C = jax.tree_util.tree_map(lambda x: tile_rows(x, w), context)

    def tokens_to_logits(tokens_C, positions_C, cache):
        return extend(model, params, cache, tokens_C[:, None], positions_C[:, None], context=context_C)

    if strategy.method != "beam":
        update = functools.partial(sample_update, strategy, pad_id)
        state = init_sample_state(strategy, b * w, pad_id, rng)
        if stream:
            update = functools.partial(_emitting, update, listener)
    else:
        update = functools.partial(beam_update, strategy)
        state = init_beam_state(strategy, b, pad_id)
    state = search(
        tokens_to_logits,
        update,
        state,
        tile_rows(first_logits_BxV, w),
        cache,
        tile_rows(lengths_B, w),
        strategy.max_new_tokens,
        lengths,
    )
    if strategy.method != "beam":
        return state.tokens_CxT, state.logp_C, state.step
    return state.finished_BxWxT[:, 0], state.finished_score_BxW[:, 0], state.step
