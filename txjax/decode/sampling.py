"""Sampling: greedy (the argmax), temperature, top-k, top-p (nucleus, Holtzman et al. 2020), all one
`choose_tokens`, and the per-step update of C independent rows."""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from txjax.decode.strategy import Strategy, is_eos
from txjax.model.masks import NEG_INF


def top_k_filter(logits_CxV, k: int):
    """Keep the k largest logits of each row (ties at the k-th value kept too), the rest -> NEG_INF; k beyond the
    vocabulary keeps every token (as transformers' TopKLogitsWarper clamps it)."""
    kth_Cx1 = jax.lax.top_k(logits_CxV, min(k, logits_CxV.shape[-1]))[0][:, -1:]
    return jnp.where(logits_CxV >= kth_Cx1, logits_CxV, NEG_INF)


def top_p_filter(logits_CxV, p: float):
    """Nucleus: keep the smallest set of most likely tokens whose probability mass reaches p (Holtzman et al. 2020).

    A token is kept iff the mass of the tokens strictly more likely than it (in sorted order) is < p.
    """
    order_CxV = jnp.argsort(-logits_CxV, axis=-1)
    probs_CxV = jax.nn.softmax(jnp.take_along_axis(logits_CxV, order_CxV, axis=-1), axis=-1)
    mass_before_CxV = jnp.cumsum(probs_CxV, axis=-1) - probs_CxV
    keep_sorted_CxV = mass_before_CxV < p
    keep_CxV = (
        jnp.zeros_like(keep_sorted_CxV).at[jnp.arange(logits_CxV.shape[0])[:, None], order_CxV].set(keep_sorted_CxV)
    )
    return jnp.where(keep_CxV, logits_CxV, NEG_INF)


def greedy_tokens(logits_CxV):
    """argmax_v z_v, the first index on a tie (as jnp.argmax), read as min{v : z_v = max_u z_u}: two plain
    reductions, which XLA:CPU runs faster than argmax's variadic (value, index) reduce."""
    max_Cx1 = logits_CxV.max(axis=-1, keepdims=True)
    index_CxV = jax.lax.broadcasted_iota(jnp.int32, logits_CxV.shape, logits_CxV.ndim - 1)
    return jnp.where(logits_CxV >= max_Cx1, index_CxV, logits_CxV.shape[-1]).min(axis=-1)


def choose_tokens(strategy: Strategy, logits_CxV, rng):
    """The argmax (method greedy), else a sample from softmax(filtered logits / temperature)."""
    if strategy.method == "greedy":
        return greedy_tokens(logits_CxV)
    logits_CxV = logits_CxV / strategy.option("temperature")
    if strategy.option("top_k"):
        logits_CxV = top_k_filter(logits_CxV, strategy.option("top_k"))
    if strategy.option("top_p") < 1:
        logits_CxV = top_p_filter(logits_CxV, strategy.option("top_p"))
    return jax.random.categorical(rng, logits_CxV).astype(jnp.int32)


@flax.struct.dataclass
class SampleState:
    """C = B*num_samples independent rows; tokens_CxT holds what was generated (pad after a row stops)."""

    step: jax.Array  # tokens generated so far
    last_C: jax.Array  # the tokens to feed next
    done: jax.Array  # every row has stopped
    tokens_CxT: jax.Array
    logp_C: jax.Array  # sum of log p(token) under the model (temperature 1)
    stopped_C: jax.Array
    rng: jax.Array


def init_sample_state(strategy: Strategy, n: int, pad_id: int, rng) -> SampleState:
    return SampleState(
        step=jnp.zeros((), jnp.int32),
        last_C=jnp.zeros((n,), jnp.int32),
        done=jnp.zeros((), bool),
        tokens_CxT=jnp.full((n, strategy.max_new_tokens), pad_id, jnp.int32),
        logp_C=jnp.zeros((n,), jnp.float32),
        stopped_C=jnp.zeros((n,), bool),
        rng=rng,
    )


def sample_update(strategy: Strategy, pad_id: int, state: SampleState, logits_CxV, cache):
    """Choose one token per row (pad once the row has stopped) and record it. Greedy draws no key: a loop whose
    state leaves its compiled call (a stream's chunk) would otherwise split the key at every step for nothing."""
    rng, key = (state.rng, None) if strategy.method == "greedy" else jax.random.split(state.rng)
    token_C = jnp.where(state.stopped_C, pad_id, choose_tokens(strategy, logits_CxV, key))
    logp_C = jnp.take_along_axis(jax.nn.log_softmax(logits_CxV), token_C[:, None], axis=-1)[:, 0]
    stopped_C = state.stopped_C | is_eos(strategy, token_C)
    new = state.replace(
        step=state.step + 1,
        last_C=token_C,
        done=stopped_C.all(),
        tokens_CxT=state.tokens_CxT.at[:, state.step].set(token_C),
        logp_C=state.logp_C + jnp.where(state.stopped_C, 0.0, logp_C),
        stopped_C=stopped_C,
        rng=rng,
    )
    return new, cache
