"""The KV cache's one schema, and the functions that create and fill its variables.

Every cached self-/cross-attention module keeps its cache in flax's 'cache' collection under the names of SCHEMA
(nn.scan adds a leading layer axis to each). A leaf has two layouts: the model's own (`trained`, [B, S, KV, K] as
in training: Flax wmt's decode=True) and the decoding layout's (`decoding`, txjax.decode.kernels.cache_layout:
rows and K/V heads on one leading axis, keys transposed). Which one a module writes is the `layout` argument of
append_kv_cache / window_kv_cache; txjax.decode.cache reads the rest of what it needs (which leaves have a row axis,
which grow with the generation, what an empty slot holds) from here too.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from txjax.model.masks import causal_mask


@dataclasses.dataclass(frozen=True)
class Leaf:
    """One cache variable: its shape in each layout (S: the target slots, W: a local layer's window, R: the source;
    a Gated DeltaNet layer's T: its convolution's last inputs, F: their channels, H, K, V: its value heads and the
    state's d_k x d_v), dtype ('keys': the keys' own), the value of an empty slot, whether it has a row axis (tiled
    to beams and samples, reordered by beam search) and whether its length grows through the generation's buckets
    (txjax.decode.cache)."""

    trained: tuple[str, ...]
    decoding: tuple[str, ...]
    dtype: str
    empty: int
    per_row: bool
    grows: bool


KEYS, VALUES, POSITIONS, INDEX = "cached_key", "cached_value", "cached_pos", "cache_index"
WINDOW_KEYS, WINDOW_VALUES, WINDOW_POSITIONS = "window_key", "window_value", "window_pos"
CROSS_KEYS, CROSS_VALUES = "cross_key", "cross_value"
LATENT, ROPE_KEY = "cached_latent", "cached_rope_key"  # multi-head latent attention's (txjax.model.latent)
CONV_STATE, DELTA_STATE = "conv_state", "delta_state"  # a Gated DeltaNet layer's (txjax.model.gated_deltanet)
SCHEMA = {
    KEYS: Leaf(("B", "S", "KV", "K"), ("B*KV", "K", "S"), "keys", 0, True, True),
    VALUES: Leaf(("B", "S", "KV", "K"), ("B*KV", "S", "K"), "keys", 0, True, True),
    POSITIONS: Leaf(("B", "S"), ("B", "S"), "int32", -1, True, True),  # each slot's position, -1: empty
    INDEX: Leaf((), (), "int32", 0, False, False),  # the slots written so far (every token, a ring buffer's too)
    WINDOW_KEYS: Leaf(("B", "W", "KV", "K"), ("B*KV", "K", "W"), "keys", 0, True, False),
    WINDOW_VALUES: Leaf(("B", "W", "KV", "K"), ("B*KV", "W", "K"), "keys", 0, True, False),
    WINDOW_POSITIONS: Leaf(("B", "W"), ("B", "W"), "int32", -1, True, False),
    CROSS_KEYS: Leaf(("B", "R", "KV", "K"), ("B*KV", "K", "R"), "keys", 0, True, False),
    CROSS_VALUES: Leaf(("B", "R", "KV", "K"), ("B*KV", "R", "K"), "keys", 0, True, False),
    # MLA: a token's compressed keys and values (C = kv_lora_rank) and the RoPE key its heads share (KR), one layout
    LATENT: Leaf(("B", "S", "C"), ("B", "S", "C"), "keys", 0, True, True),
    ROPE_KEY: Leaf(("B", "S", "KR"), ("B", "S", "KR"), "keys", 0, True, True),
    CONV_STATE: Leaf(("B", "T", "F"), ("B", "T", "F"), "float32", 0, True, False),
    DELTA_STATE: Leaf(("B", "H", "K", "V"), ("B", "H", "K", "V"), "float32", 0, True, False),
}


def length_axis(name: str, layout: str) -> int:
    """The axis of a leaf's slots (S, W or R) in `layout` ('trained' | 'decoding'), counted from the front."""
    shape = getattr(SCHEMA[name], layout)
    return next(i for i, axis in enumerate(shape) if axis in ("S", "W", "R"))


def empty_value(name: str) -> int:
    return SCHEMA[name].empty


def bytes_per_token(cache, rows: int, slots: int) -> int:
    """The bytes of a cache's keys and values (the growing leaves of the keys' dtype: MLA's latent and RoPE key)
    per row and slot, every layer summed, from the cache of `rows` rows and `slots` slots (arrays or shapes)."""
    leaves = jax.tree_util.tree_leaves_with_path(cache)
    kept = [leaf for path, leaf in leaves if SCHEMA[path[-1].key].grows and SCHEMA[path[-1].key].dtype == "keys"]
    return sum(leaf.size * leaf.dtype.itemsize for leaf in kept) // (rows * slots)


def _variable(module, name, shape, dtype):
    """The module's cache variable `name` of SCHEMA, created empty if missing."""
    dtype = jnp.dtype(SCHEMA[name].dtype) if SCHEMA[name].dtype != "keys" else dtype
    return module.variable("cache", name, jnp.full, shape, SCHEMA[name].empty, dtype)


def write_slots(cache, new, i, axis: int):
    """The cache with `new` written at slots i.. of `axis` (dynamic_update_slice, in place in a decode loop).

    One slot of a 16-bit cache on XLA:CPU is written as a select over the whole cache instead, where(slot == i, new,
    cache): XLA:CPU's in-place update of 16-bit values is the slower of the two (benchmarks/cache_update.py)."""
    if new.shape[axis] == 1 and cache.dtype.itemsize == 2 and jax.default_backend() == "cpu":
        return jnp.where(jax.lax.broadcasted_iota(jnp.int32, cache.shape, axis) == i, new, cache)
    return jax.lax.dynamic_update_slice(cache, new, tuple(i if a == axis else 0 for a in range(cache.ndim)))


def stored_positions(q_pos, mask):
    """The positions a cache stores for the new tokens q_pos [B, L]: -1 (empty) where `mask` [B, 1, L, L] excludes a
    token from its own slot (left padding)."""
    own = jnp.ones(q_pos.shape, bool) if mask is None else jnp.diagonal(mask[:, 0], axis1=1, axis2=2)
    return jnp.where(own, q_pos, -1).astype(jnp.int32)


def filled_causal(q_pos, k_pos):
    """The queries' mask over cache slots at positions k_pos [B, S]: a filled slot at a position <= the query's."""
    return (k_pos[:, None, None, :] >= 0) & causal_mask(q_pos, k_pos)


def cache_positions(cpos, cidx, q_pos, mask):
    """A decode call's bookkeeping: store the new tokens' positions (stored_positions) at cache_index in the slots'
    positions `cpos` [B, S] and advance the index -> (the slots' positions [B, S], the queries' mask over them
    [B, 1, L, S]: filled_causal)."""
    cpos.value = jax.lax.dynamic_update_slice(cpos.value, stored_positions(q_pos, mask), (0, cidx.value))
    cidx.value = cidx.value + q_pos.shape[1]
    return cpos.value, filled_causal(q_pos, cpos.value)


def window_kv_cache(module, k_new, v_new, q_pos, mask, window: int, layout: str = "trained"):
    """A local layer's self-attention cache: a ring buffer of `window` slots (window_key, window_value, window_pos
    [B, window]), memory O(window) whatever the context. The new tokens (L of them, a prefill chunk may be longer
    than the window) attend over the buffer as it was and their own keys together, [old window | new L] -> (keys,
    values, their positions [B, window + L], mask [B, 1, L, window + L]; the caller adds the window's band); then
    the last min(L, window) of them overwrite the oldest slots, slot = token index mod window (cache_index counts
    every token, as the full cache's)."""
    (b, l), is_init = q_pos.shape, not module.has_variable("cache", WINDOW_KEYS)
    axes = length_axis(WINDOW_KEYS, layout), length_axis(WINDOW_VALUES, layout)
    ring = lambda t, axis: (*t.shape[:axis], window, *t.shape[axis + 1 :])
    ck = _variable(module, WINDOW_KEYS, ring(k_new, axes[0]), k_new.dtype)
    cv = _variable(module, WINDOW_VALUES, ring(v_new, axes[1]), v_new.dtype)
    cpos = _variable(module, WINDOW_POSITIONS, (b, window), None)
    cidx = _variable(module, INDEX, (), None)
    if is_init:  # model.init(decode=True) on a [B, max_len] dummy only allocates the cache
        return k_new, v_new, q_pos, mask
    stored = stored_positions(q_pos, mask)
    keys, values = (jnp.concatenate([c.value, t], a) for c, t, a in ((ck, k_new, axes[0]), (cv, v_new, axes[1])))
    k_pos = jnp.concatenate([cpos.value, stored], axis=1)
    m = min(l, window)  # the tokens that stay: the last m (distinct slots, so no write order matters)
    slots = (cidx.value + l - m + jnp.arange(m)) % window
    last = lambda t, axis: jax.lax.slice_in_dim(t, l - m, l, axis=axis)
    at = lambda axis: (slice(None),) * axis + (slots,)
    ck.value = ck.value.at[at(axes[0])].set(last(k_new, axes[0]))
    cv.value = cv.value.at[at(axes[1])].set(last(v_new, axes[1]))
    cpos.value = cpos.value.at[:, slots].set(last(stored, 1))
    cidx.value = cidx.value + l
    return keys, values, k_pos, filled_causal(q_pos, k_pos)


def cross_kv_cache(module, k_new, v_new):
    """Cross-attention's cache: the encoder's keys/values, stored by the first decode call, read by the later ones
    (k_new None)."""
    if k_new is not None:
        module.put_variable("cache", CROSS_KEYS, k_new)
        module.put_variable("cache", CROSS_VALUES, v_new)
    return module.get_variable("cache", CROSS_KEYS), module.get_variable("cache", CROSS_VALUES)


def append_kv_cache(module, k_new, v_new, q_pos, mask, layout: str = "trained", names=(KEYS, VALUES)):
    """Self-attention's cache: write the new keys/values (L slots of `layout`) at cache_index of the cache of max_len
    slots (cached_pos [B, max_len]: each slot's position, -1 = empty) -> the whole cache, its positions and mask (a
    filled slot at a position <= the query's that `mask`, the new tokens' [B, 1, L, L], does not exclude).
    `names`: the two leaves written (MLA's: LATENT and ROPE_KEY)."""
    (b, l), is_init = q_pos.shape, not module.has_variable("cache", names[0])
    ck = _variable(module, names[0], k_new.shape, k_new.dtype)
    cv = _variable(module, names[1], v_new.shape, v_new.dtype)
    cpos = _variable(module, POSITIONS, (b, l), None)
    cidx = _variable(module, INDEX, (), None)
    if is_init:  # model.init(decode=True) on a [B, max_len] dummy only allocates the cache
        return k_new, v_new, q_pos, mask
    ck.value = write_slots(ck.value, k_new, cidx.value, axis=length_axis(names[0], layout))
    cv.value = write_slots(cv.value, v_new, cidx.value, axis=length_axis(names[1], layout))
    return ck.value, cv.value, *cache_positions(cpos, cidx, q_pos, mask)


def linear_state_cache(module, conv_shape, state_shape):
    """A Gated DeltaNet layer's cache, the same in both layouts: its convolution's last inputs (conv_state [B,
    conv - 1, C]), its state (delta_state [B, H, K, V]), float32, and the tokens seen (cache_index) -> (the three
    variables, whether this call only allocates them: model.init(decode=True))."""
    is_init = not module.has_variable("cache", DELTA_STATE)
    conv = _variable(module, CONV_STATE, conv_shape, None)
    state = _variable(module, DELTA_STATE, state_shape, None)
    return conv, state, _variable(module, INDEX, (), None), is_init
