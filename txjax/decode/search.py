"""The compiled generation loop: prefill, then feed-and-choose inside lax.while_loops, one per cache length.

A pure `tokens_to_logits` step (Flax wmt/lm1b style: one cached `extend` call) runs for the whole generation (no
host round trip per token, one compilation whatever the length). The cache starts at the smallest of a few bucketed
lengths that holds the prompt and grows to the next when full (`cache.bucket_lengths`), so a step's attention reads
about the filled slots, not the whole capacity; a strategy's `update(state, logits_CxV, cache) -> (state, cache)`
picks the next tokens (sampling.sample_update or beam.beam_update). Both stop a row at `eos_id` and leave the loop
early once every row has stopped.

The loop is written once as `begin` (prefill and the first choice) and `run_steps` (feed-and-choose in one cache
length until a given step); `generate_ids` compiles them into one program, `stream_ids` calls them compiled apart,
a chunk of steps a call, and hands each chunk's tokens to the host as it ends (streaming, txjax.decode.stream).
"""

from __future__ import annotations

import functools
import time
from typing import Any

import einops
import flax.struct
import jax
import jax.numpy as jnp

from txjax.decode.beam import beam_update, init_beam_state
from txjax.decode.cache import bucket_lengths, extend, filled, gather_rows, grow, init_cache, tile_rows
from txjax.decode.sampling import init_sample_state, sample_update
from txjax.decode.strategy import Strategy
from txjax.families import family_of

CHUNK_SECONDS = 0.05  # stream_ids: each call runs the steps that took about this long at the last call's pace


@flax.struct.dataclass
class Loop:
    """What the loop carries from step to step (and, streaming, from one compiled call to the next): the strategy's
    state, the cache, the family's context tiled to the C = B*W rows and each row's first generated position."""

    state: Any
    cache: Any
    context_C: Any
    start_C: jax.Array


def _update(strategy: Strategy, pad_id: int):
    if strategy.method == "beam":
        return functools.partial(beam_update, strategy)
    return functools.partial(sample_update, strategy, pad_id)


def fed_length(prompt_len: int, chunk: int | None) -> int:
    """The cache slots the prefill fills: the prompt's length padded to a multiple of `chunk` (pad_to_chunks)."""
    return prompt_len + (-prompt_len % chunk if chunk and chunk < prompt_len else 0)


def cache_lengths(strategy: Strategy, prompt_len: int, first_bucket: int) -> tuple[int, ...]:
    """The cache lengths a generation from prompts of `prompt_len` tokens runs through, one loop each."""
    fed = fed_length(prompt_len, strategy.prefill_chunk)
    return bucket_lengths(fed, fed + strategy.max_new_tokens - 1, first_bucket)


def begin(model, params, strategy: Strategy, pad_id: int, prompt_BxP, lengths_B, source, rng, first_bucket) -> Loop:
    """The family's encode, the prompts' prefill into a cache of the first bucket's length, the cache tiled to W
    rows per input (beams or samples) and the first choice, from the prefill's logits.

    The prompts fill the cache in one call (positions start at 0 at each row's first real token and pad slots are
    segment 0, stored as empty, so each row generates what it would alone)."""
    (b, p), w = prompt_BxP.shape, strategy.rows_per_prompt
    context = family_of(model).encode(model, params, source)
    first_real_B = p - lengths_B
    positions_BxP = jnp.maximum(jnp.arange(p)[None, :] - first_real_B[:, None], 0)
    segment_ids_BxP = (jnp.arange(p)[None, :] >= first_real_B[:, None]).astype(jnp.int32)
    fed = pad_to_chunks((prompt_BxP, positions_BxP, segment_ids_BxP), strategy.prefill_chunk)
    length = cache_lengths(strategy, p, first_bucket)[0]
    cache = init_cache(model, b, length, None if source is None else source[0].shape[1])
    first_logits_BxV, cache = prefill_in_chunks(model, params, cache, fed, context, strategy.prefill_chunk)
    if w > 1:
        cache = gather_rows(cache, jnp.repeat(jnp.arange(b), w))
    if strategy.method == "beam":
        state = init_beam_state(strategy, b, pad_id)
    else:
        state = init_sample_state(strategy, b * w, pad_id, rng)
    state, cache = _update(strategy, pad_id)(state, tile_rows(first_logits_BxV, w), cache)
    context_C = jax.tree_util.tree_map(lambda x: tile_rows(x, w), context)
    return Loop(state=state, cache=cache, context_C=context_C, start_C=tile_rows(lengths_B, w))


def run_steps(model, params, strategy: Strategy, pad_id: int, loop: Loop, length: int, until) -> Loop:
    """Feed-and-choose in one lax.while_loop until `until` tokens are chosen, every row has stopped or the cache (of
    `length` slots: grow it first) is full. The token chosen at step s (0-based) sits at position start + s; it is
    fed back only if another is needed."""
    update = _update(strategy, pad_id)

    def body(carry):
        state, cache = carry
        positions_C = loop.start_C + state.step - 1
        logits_CxV, cache = extend(
            model, params, cache, state.last_C[:, None], positions_C[:, None], context=loop.context_C
        )
        return update(state, logits_CxV, cache)

    def cond(carry):
        state, cache = carry
        room = filled(cache) < length  # a free slot for the token fed next
        return (state.step < until) & ~state.done & room

    state, cache = jax.lax.while_loop(cond, body, (loop.state, loop.cache))
    return loop.replace(state=state, cache=cache)


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


def _outputs(strategy: Strategy, state):
    """(tokens [C', T], scores [C'], steps) of a finished loop: every sampled row, or each input's best beam."""
    if strategy.method != "beam":
        return state.tokens_CxT, state.logp_C, state.step
    return state.finished_BxWxT[:, 0], state.finished_score_BxW[:, 0], state.step


@functools.partial(jax.jit, static_argnums=(0, 2, 3), static_argnames=("first_bucket",))
def generate_ids(model, params, strategy: Strategy, pad_id: int, prompt_BxP, lengths_B, source, rng, first_bucket=64):
    """Left-padded prompts [B, P] (real tokens last) with their lengths [B], and the sources the family encodes
    ((right-padded ids [B, S], lengths [B]); an LM: None) -> (tokens [B*W', T], scores [B*W'], steps) in one
    compiled call, W' = num_samples for sampling and 1 (the best hypothesis) for beam search; steps: loop steps taken.

    `begin`, then `run_steps` in each cache length (`cache_lengths`, from `first_bucket` slots), the cache grown to
    each before its loop."""
    loop = begin(model, params, strategy, pad_id, prompt_BxP, lengths_B, source, rng, first_bucket)
    for length in cache_lengths(strategy, prompt_BxP.shape[1], first_bucket):
        loop = loop.replace(cache=grow(loop.cache, length))
        loop = run_steps(model, params, strategy, pad_id, loop, length, strategy.max_new_tokens)
    return _outputs(strategy, loop.state)


_begin = jax.jit(begin, static_argnums=(0, 2, 3), static_argnames=("first_bucket",))
_grow = jax.jit(lambda loop, length: loop.replace(cache=grow(loop.cache, length)), static_argnums=1)
# `until` traced: one compilation per cache length whatever the chunks; the carry donated: updated in place. The
# decoding step `run.py compile --step=decode` compiles for a topology (txjax.training.aot).
decode_steps = jax.jit(run_steps, static_argnums=(0, 2, 3, 5), donate_argnums=4)


def stream_ids(model, params, strategy: Strategy, pad_id: int, prompt_BxP, lengths_B, source, rng, first_bucket=64):
    """generate_ids' generation (greedy or sampling) as a generator: yields each chunk of the chosen tokens
    ([C, n] numpy, n >= 1; a stopped row's are pad_id) as soon as its compiled call ends, and returns what
    generate_ids returns. The same `begin` and `run_steps` compiled apart: the first call runs one step, each next
    one the steps that took about CHUNK_SECONDS at the last call's pace (or until the cache's bucket is full), so
    tokens come out many times a second and the host's work between calls is a small part of the time. Closing it
    leaves nothing running: each call's tokens are read back before the next one starts."""
    if strategy.method == "beam":
        raise ValueError("a beam search's tokens are known at its end: stream greedy or sampled tokens")
    loop = _begin(model, params, strategy, pad_id, prompt_BxP, lengths_B, source, rng, first_bucket=first_bucket)
    fed = fed_length(prompt_BxP.shape[1], strategy.prefill_chunk)
    tokens_CxT, step, done = jax.device_get((loop.state.tokens_CxT, loop.state.step, loop.state.done))
    yield tokens_CxT[:, :step]
    chunk = 1
    for length in cache_lengths(strategy, prompt_BxP.shape[1], first_bucket):
        if step == strategy.max_new_tokens or done:
            break
        loop = _grow(loop, length)
        while step < strategy.max_new_tokens and not done and fed + step - 1 < length:  # filled slots < length
            began, shown = time.perf_counter(), step
            loop = decode_steps(model, params, strategy, pad_id, loop, length, shown + chunk)
            tokens_CxT, step, done = jax.device_get((loop.state.tokens_CxT, loop.state.step, loop.state.done))
            # the next call: the steps that take CHUNK_SECONDS at this call's pace (its dispatch included: an
            # underestimate; after a call that compiled, a few steps, then the true pace); the reader's time after
            # the yield is not the loop's
            pace = (step - shown) / max(time.perf_counter() - began, 1e-9)  # steps a second
            chunk = max(1, int(min(strategy.max_new_tokens, pace * CHUNK_SECONDS)))
            yield tokens_CxT[:, shown:step]
    return _outputs(strategy, loop.state)
