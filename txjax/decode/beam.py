"""Beam search (Wu et al. 2016): W = beam_size alive and W finished hypotheses per row (the t5x / Flax wmt
formulation), the GNMT length penalty, the cache reordered by a gather over the batch*beam axis."""

from __future__ import annotations

import einops
import flax.struct
import jax
import jax.numpy as jnp

from txjax.decode.cache import LENGTH_AXIS, gather_rows
from txjax.decode.strategy import Strategy, is_eos
from txjax.model.masks import NEG_INF


def length_penalty(length, alpha):
    """GNMT length penalty lp(L) = ((5 + L) / 6)^alpha (Wu et al. 2016, eq. 14); a hypothesis scores log P / lp."""
    return ((5.0 + length) / 6.0) ** alpha


@flax.struct.dataclass
class BeamState:
    """Per row W alive hypotheses (no EOS yet, raw log-prob) and the W best finished ones (log-prob / lp)."""

    step: jax.Array
    last_C: jax.Array  # C = B*W, the alive beams' last tokens
    done: jax.Array
    alive_BxWxT: jax.Array
    alive_logp_BxW: jax.Array
    finished_BxWxT: jax.Array
    finished_score_BxW: jax.Array


def init_beam_state(strategy: Strategy, b: int, pad_id: int) -> BeamState:
    w, t = strategy.option("beam_size"), strategy.max_new_tokens
    seqs = jnp.full((b, w, t), pad_id, jnp.int32)
    alive_logp = jnp.tile(jnp.array([0.0] + [NEG_INF] * (w - 1), jnp.float32), (b, 1))  # all beams start as one
    return BeamState(
        step=jnp.zeros((), jnp.int32),
        last_C=jnp.zeros((b * w,), jnp.int32),
        done=jnp.zeros((), bool),
        alive_BxWxT=seqs,
        alive_logp_BxW=alive_logp,
        finished_BxWxT=seqs,
        finished_score_BxW=jnp.full((b, w), NEG_INF, jnp.float32),
    )


def beam_update(strategy: Strategy, state: BeamState, logits_CxV, cache):
    """One beam step: the 2W best extensions of the alive beams; those ending (EOS, or the length limit) join the
    finished set scored log P / lp(length), the W best without EOS stay alive; the cache follows their parents."""
    b, w, _ = state.alive_BxWxT.shape
    v = logits_CxV.shape[-1]
    logp_BxWxV = einops.rearrange(jax.nn.log_softmax(logits_CxV), "(b w) v -> b w v", w=w)
    candidates_BxWV = (state.alive_logp_BxW[:, :, None] + logp_BxWxV).reshape(b, w * v)
    top_logp_Bx2W, top_index_Bx2W = jax.lax.top_k(candidates_BxWV, 2 * w)
    parent_Bx2W, token_Bx2W = top_index_Bx2W // v, (top_index_Bx2W % v).astype(jnp.int32)
    seqs_Bx2WxT = jnp.take_along_axis(state.alive_BxWxT, parent_Bx2W[:, :, None], axis=1)
    seqs_Bx2WxT = seqs_Bx2WxT.at[:, :, state.step].set(token_Bx2W)
    eos_Bx2W = is_eos(strategy, token_Bx2W)
    last = state.step + 1 == strategy.max_new_tokens
    # like Hugging Face's BeamSearchScorer, only an EOS ranked among the W best may finish (so W=1 is greedy)
    finishes_Bx2W = (eos_Bx2W & (jnp.arange(2 * w) < w)) | last

    alpha = strategy.option("length_penalty")
    lp = length_penalty(state.step + 1.0, alpha)
    new_scores_Bx2W = jnp.where(finishes_Bx2W, top_logp_Bx2W / lp, NEG_INF)
    finished_score_BxW, pick_BxW = jax.lax.top_k(
        jnp.concatenate([state.finished_score_BxW, new_scores_Bx2W], axis=1), w
    )
    finished_BxWxT = jnp.take_along_axis(
        jnp.concatenate([state.finished_BxWxT, seqs_Bx2WxT], axis=1), pick_BxW[:, :, None], axis=1
    )

    alive_logp_BxW, keep_BxW = jax.lax.top_k(jnp.where(eos_Bx2W | last, NEG_INF, top_logp_Bx2W), w)
    alive_BxWxT = jnp.take_along_axis(seqs_Bx2WxT, keep_BxW[:, :, None], axis=1)
    parent_BxW = jnp.take_along_axis(parent_Bx2W, keep_BxW, axis=1)
    token_BxW = jnp.take_along_axis(token_Bx2W, keep_BxW, axis=1)
    # log P only falls and lp(L) <= lp(max) for alpha >= 0, so no alive beam can beat this bound any more
    best_possible_B = alive_logp_BxW[:, 0] / length_penalty(float(strategy.max_new_tokens), alpha)
    new = state.replace(
        step=state.step + 1,
        last_C=token_BxW.reshape(-1),
        done=(finished_score_BxW[:, 0] >= best_possible_B).all(),
        alive_BxWxT=alive_BxWxT,
        alive_logp_BxW=alive_logp_BxW,
        finished_BxWxT=finished_BxWxT,
        finished_score_BxW=finished_score_BxW,
    )
    rows_C = (jnp.arange(b)[:, None] * w + parent_BxW).reshape(-1)
    return new, gather_rows(cache, rows_C, leaves=tuple(LENGTH_AXIS))  # parents stay in their row: no cross K/V
