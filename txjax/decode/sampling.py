"""Sampling: greedy (the argmax), temperature, top-k, top-p (nucleus, Holtzman et al. 2020), all one
`choose_tokens`, and the per-step update of N independent rows."""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from txjax.attention import NEG_INF
from txjax.decode.strategy import Strategy, is_eos


def top_k_filter(logits_NxV, k: int):
    """Keep the k largest logits of each row (ties at the k-th value kept too), the rest -> NEG_INF."""
    kth_N1 = jax.lax.top_k(logits_NxV, k)[0][:, -1:]
    return jnp.where(logits_NxV >= kth_N1, logits_NxV, NEG_INF)


def top_p_filter(logits_NxV, p: float):
    """Nucleus: keep the smallest set of most likely tokens whose probability mass reaches p (Holtzman et al. 2020).

    A token is kept iff the mass of the tokens strictly more likely than it (in sorted order) is < p.
    """
    order_NxV = jnp.argsort(-logits_NxV, axis=-1)
    probs_NxV = jax.nn.softmax(jnp.take_along_axis(logits_NxV, order_NxV, axis=-1), axis=-1)
    mass_before_NxV = jnp.cumsum(probs_NxV, axis=-1) - probs_NxV
    keep_sorted_NxV = mass_before_NxV < p
    keep_NxV = (
        jnp.zeros_like(keep_sorted_NxV).at[jnp.arange(logits_NxV.shape[0])[:, None], order_NxV].set(keep_sorted_NxV)
    )
    return jnp.where(keep_NxV, logits_NxV, NEG_INF)


def greedy_tokens(logits_NxV):
    """argmax_v z_v, the first index on a tie (as jnp.argmax), read as min{v : z_v = max_u z_u}: two plain
    reductions, which XLA:CPU runs faster than argmax's variadic (value, index) reduce."""
    max_N1 = logits_NxV.max(axis=-1, keepdims=True)
    index_NxV = jax.lax.broadcasted_iota(jnp.int32, logits_NxV.shape, logits_NxV.ndim - 1)
    return jnp.where(logits_NxV >= max_N1, index_NxV, logits_NxV.shape[-1]).min(axis=-1)


def choose_tokens(strategy: Strategy, logits_NxV, rng):
    """The argmax (method greedy), else a sample from softmax(filtered logits / temperature)."""
    if strategy.method == "greedy":
        return greedy_tokens(logits_NxV)
    logits_NxV = logits_NxV / strategy.option("temperature")
    if strategy.option("top_k"):
        logits_NxV = top_k_filter(logits_NxV, strategy.option("top_k"))
    if strategy.option("top_p") < 1:
        logits_NxV = top_p_filter(logits_NxV, strategy.option("top_p"))
    return jax.random.categorical(rng, logits_NxV).astype(jnp.int32)


@flax.struct.dataclass
class SampleState:
    """N = B*num_samples independent rows; tokens_NxT holds what was generated (pad after a row stops)."""

    step: jax.Array  # tokens generated so far
    last_N: jax.Array  # the tokens to feed next
    done: jax.Array  # every row has stopped
    tokens_NxT: jax.Array
    logp_N: jax.Array  # sum of log p(token) under the model (temperature 1)
    stopped_N: jax.Array
    rng: jax.Array


def init_sample_state(strategy: Strategy, n: int, pad_id: int, rng) -> SampleState:
    return SampleState(
        step=jnp.zeros((), jnp.int32),
        last_N=jnp.zeros((n,), jnp.int32),
        done=jnp.zeros((), bool),
        tokens_NxT=jnp.full((n, strategy.max_new_tokens), pad_id, jnp.int32),
        logp_N=jnp.zeros((n,), jnp.float32),
        stopped_N=jnp.zeros((n,), bool),
        rng=rng,
    )


def sample_update(strategy: Strategy, pad_id: int, state: SampleState, logits_NxV, cache):
    """Choose one token per row (pad once the row has stopped) and record it."""
    rng, key = jax.random.split(state.rng)
    token_N = jnp.where(state.stopped_N, pad_id, choose_tokens(strategy, logits_NxV, key))
    logp_N = jnp.take_along_axis(jax.nn.log_softmax(logits_NxV), token_N[:, None], axis=-1)[:, 0]
    stopped_N = state.stopped_N | is_eos(strategy, token_N)
    new = state.replace(
        step=state.step + 1,
        last_N=token_N,
        done=stopped_N.all(),
        tokens_NxT=state.tokens_NxT.at[:, state.step].set(token_N),
        logp_N=state.logp_N + jnp.where(state.stopped_N, 0.0, logp_N),
        stopped_N=stopped_N,
        rng=rng,
    )
    return new, cache
