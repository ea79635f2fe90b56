"""The KV cache in generation: an empty one from shapes, one cached model call (`extend`), row gathers (tiling
prompts to beams or samples, reordering beams), and growth through a few bucketed lengths (so that a decode step
reads the filled part of the cache, not its capacity). Its leaves are txjax.model.kv_cache.SCHEMA's."""

from __future__ import annotations

import dataclasses
import functools

import einops
import jax
import jax.numpy as jnp

from txjax.decode import kernels
from txjax.families import family_of, init_params
from txjax.model import kv_cache
from txjax.model.models import unstack_layers

# what generation reads of the cache's schema (txjax.model.kv_cache.SCHEMA; its leaves in decoding's layout)
ROW_LEAVES = tuple(name for name, leaf in kv_cache.SCHEMA.items() if leaf.per_row)
# the slot axis of the growing leaves, from the end
LENGTH_AXIS = {
    name: kv_cache.length_axis(name, "decoding") - len(leaf.decoding)
    for name, leaf in kv_cache.SCHEMA.items()
    if leaf.grows
}


def empty_cache(model, batch_size: int, max_len: int, src_len: int | None = None):
    """The model's own empty KV cache for `max_len` target tokens (encoder-decoder: and `src_len` source tokens):
    the cache the family's first decode_step creates (flax makes a missing 'cache' variable), from shapes alone
    (jax.eval_shape): keys/values zero, every slot's position -1 (empty), index 0. Its layout is that of the
    methods that run: the model's own [B, S, KV, K], or decoding's under `kernels.installed()` (init_cache)."""
    return _emptied(_created_shapes(model, batch_size, max_len, src_len))


def init_cache(model, batch_size: int, max_len: int, src_len: int | None = None):
    """The empty KV cache that generation fills: `empty_cache` in decoding's layout (txjax.decode.kernels)."""
    return _emptied(_decoding_shapes(model, batch_size, max_len, src_len))


@functools.lru_cache(maxsize=32)  # a trace of the model's init and of a prefill; every generation call asks
def _decoding_shapes(model, batch_size: int, max_len: int, src_len: int | None):
    with kernels.installed():
        return _created_shapes(model, batch_size, max_len, src_len)


def _created_shapes(model, batch_size: int, max_len: int, src_len: int | None):
    """The shapes of the cache the family's first decode_step creates, in the layout of the methods that run."""
    family = family_of(model)

    def created():
        params = init_params(model, jax.random.key(0))
        source = (
            None if src_len is None else (jnp.zeros((batch_size, src_len), jnp.int32), jnp.full(batch_size, src_len))
        )
        context = family.encode(model, params, source)
        tokens_BxL = jnp.zeros((batch_size, max_len), jnp.int32)
        return family.decode_step(model, {"params": params}, context, tokens_BxL, None, prefill=True)[1]["cache"]

    return jax.eval_shape(created)


def _emptied(shapes):
    empty = lambda path, s: jnp.full(s.shape, kv_cache.empty_value(path[-1].key), s.dtype)
    return jax.tree_util.tree_map_with_path(empty, shapes)


def extend(model, params, cache, tokens_CxL, positions_CxL, segment_ids_CxL=None, *, context=None, prefill=False):
    """Append L tokens to the cache in one call (prefill: the prompt; a decode step: L = 1).

    Returns (next-token logits at the last slot [C, V] float32, cache). `context`: the family's `encode` of the
    generation's sources (an LM: None); `prefill`: the generation's first call.
    """
    variables, family = {"params": params, "cache": cache}, family_of(model)
    # the decoding layout's parameters and cache read by its kernels; the family's context outside them, so that
    # what it intercepts sees what the kernels return (flax runs the first interceptor installed outermost)
    with family.around_cached_call(prefill), kernels.installed():
        logits, mutated = family.decode_step(
            model, variables, context, tokens_CxL, positions_CxL, segment_ids_CxL, prefill
        )
    return logits[:, -1], mutated["cache"]


def bucket_lengths(prefill_len: int, cache_len: int, first: int = 64) -> tuple[int, ...]:
    """The lengths a generation's cache grows through: first, 2 first, 4 first, ... (the smallest one holding the
    prefill), cut at cache_len. A decode step attends over every slot of the cache it is given, so with doubling
    buckets a step reads at most 2x the filled slots (a cache of its whole capacity: up to cache_len / filled x);
    one loop body is compiled per bucket (log2(cache_len / first) + 1 of them)."""
    lengths = [first]
    while lengths[-1] < prefill_len:
        lengths[-1] *= 2
    while lengths[-1] < cache_len:
        lengths.append(2 * lengths[-1])
    return tuple(min(n, cache_len) for n in lengths)


def grow(cache, length: int):
    """The cache with room for `length` target positions: keys/values padded with zeros, their positions with -1
    (empty, so no query attends to them); cross-attention's keys/values and the index unchanged."""

    def pad(path, leaf):
        name = path[-1].key
        if name not in LENGTH_AXIS:
            return leaf
        axis = leaf.ndim + LENGTH_AXIS[name]
        widths = [(0, 0)] * leaf.ndim
        widths[axis] = (0, length - leaf.shape[axis])
        return jnp.pad(leaf, widths, constant_values=kv_cache.empty_value(name))

    return jax.tree_util.tree_map_with_path(pad, cache)


def filled(cache):
    """The number of target slots written so far (cache_index; the same in every layer)."""
    index = next(leaf for path, leaf in jax.tree_util.tree_leaves_with_path(cache) if path[-1].key == kv_cache.INDEX)
    return index.reshape(-1)[0]


def for_decoding(model, params, rows: int = 1):
    """The same model with decoding's parameters for `rows` rows decoded at once: its layers unrolled
    (scan_layers=False, params via unstack_layers: under nn.scan each decode step copies every layer's cache slice
    out of and back into the stacked cache), the input projections fused and, for one row on a CPU, every kernel
    stored output axes first (kernels.decoding_params; kernels.out_major_product says why one row only). The cached
    calls here (init_cache, extend) read them with txjax.decode.kernels installed. Idempotent: decoding parameters
    come back as they are, whatever `rows`."""
    cfg = model.cfg
    if not cfg.scan_layers and kernels.is_decoding(params):
        return model, params
    out_major = rows == 1 and jax.default_backend() == "cpu"  # an XLA:CPU matrix-vector trick, unmeasured elsewhere
    params = kernels.decoding_params(unstack_layers(params) if cfg.scan_layers else params, out_major=out_major)
    return model.clone(cfg=dataclasses.replace(cfg, scan_layers=False)), params


def gather_rows(cache, rows_C, leaves=ROW_LEAVES):
    """cache rows (batch axis) -> cache[rows_C] for every per-row leaf named in `leaves`: tiling to B*W rows (all
    of them) and beam reordering (the self-attention ones: every beam of a row holds its source's cross-attention
    keys/values, which a reorder within the row leaves as they are).

    cache_index is shared.
    """
    row_axis = lambda name, leaf: leaf.ndim - len(kv_cache.SCHEMA[name].decoding)  # where a leaf's layout begins
    b = next(
        leaf.shape[row_axis(path[-1].key, leaf)]
        for path, leaf in jax.tree_util.tree_leaves_with_path(cache)
        if path[-1].key in ROW_LEAVES and kv_cache.SCHEMA[path[-1].key].decoding[0] == "B"
    )

    def gather(path, leaf):
        name = path[-1].key
        if name not in leaves:
            return leaf
        if kv_cache.SCHEMA[name].decoding[0] == "B":  # rows on an axis of their own (positions, linear layers)
            return jnp.take(leaf, rows_C, axis=row_axis(name, leaf))
        by_row = einops.rearrange(leaf, "... (b g) x y -> ... b g x y", b=b)  # cache_layout's rows apart
        return einops.rearrange(jnp.take(by_row, rows_C, axis=-4), "... c g x y -> ... (c g) x y")

    return jax.tree_util.tree_map_with_path(gather, cache)


def tile_rows(x, w: int):
    """Repeat each row w times along axis 0: [B, ...] -> [B*w, ...] (row b*w + j is a copy of row b)."""
    return x if w == 1 else einops.repeat(x, "b ... -> (b w) ...", w=w)
