"""Self-speculative greedy decoding with the multi-token-prediction modules as the draft (DeepSeek-V3, sec. 2.2 and
5.4.3: its MTP module's second token accepted 85-90% of the time): the modules (txjax.model.mtp) propose the next D
tokens, one cached call of the model over [the last token; the D drafts] verifies them, and the longest prefix of
drafts equal to the model's own greedy choices is kept with the model's token after it: 1 to D + 1 tokens a call,
the tokens plain greedy decoding chooses (up to ties between logits that two compiled programs round apart).

A round, for a row with n tokens t_0 .. t_{n-1} known, t_{n-1} not yet fed:
    feed [t_{n-1}, d_1 .. d_D] at positions n-1 .. n-1+D     one cached call: g_0 .. g_D, the argmax at each
    a = how many leading drafts have d_j = g_{j-1}             t_n .. t_{n+a} = g_0 .. g_a
    the fed slots after the accepted ones are emptied          position -1: no query attends to them (kv_cache)
    d'_k: module k at position n+a-1 (the last fed hidden state h), its input e_{n+a-1+k} = t_{n+a}, d'_1, ...
The cache index advances D + 1 slots a round whatever is kept (the refused drafts' slots stay as holes), so the
cache holds P + (D + 1) x max_new_tokens slots. The modules run uncached over the rows' buffers of hidden states and
tokens (every position so far, once per depth): their cost grows with the length, the model's does not. A local
layer's ring buffer and a Gated DeltaNet layer's state cannot forget a refused draft: such models are refused.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from txjax.decode import kernels
from txjax.decode.cache import filled, for_decoding, init_cache
from txjax.decode.strategy import Strategy, is_eos
from txjax.families import DECODER_LM, family_of
from txjax.model import kv_cache, mtp
from txjax.model.blockwise import Segments
from txjax.model.models import Embedder


def check_model(model, strategy: Strategy) -> None:
    """A ValueError naming what self-speculative decoding lacks: MTP modules, greedy, a cache that forgets."""
    cfg = model.cfg
    if family_of(model) is not DECODER_LM or not cfg.mtp_depth:
        raise ValueError("speculative decoding drafts with the MTP modules: a decoder LM with model.mtp_depth > 0")
    if strategy.method != "greedy" or strategy.prefill_chunk:
        raise ValueError("speculative decoding is greedy, its prompt fed at once: method=greedy, no prefill_chunk")
    if cfg.attention_window or any(layer.linear for layer in cfg.layer_attention):
        raise ValueError(
            "speculative decoding empties refused drafts' cache slots: a local window's ring buffer or a linear "
            "layer's state cannot forget one (set model.attention_window=0 and model.layer_types='')"
        )


@flax.struct.dataclass
class Rounds:
    """The loop's carry: C rows, T = P + max_new_tokens + D + 1 positions (a row's tokens at their positions)."""

    n_C: jax.Array  # tokens known (prompt and generated)
    tokens_CxT: jax.Array
    hidden_CxTxD: jax.Array  # the decoder's output h at every fed position (0 .. n - 2 are the known ones)
    drafts_CxD: jax.Array
    cache: Any
    stopped_C: jax.Array  # EOS chosen, or max_new_tokens reached
    logp_C: jax.Array  # the generated tokens' log-probabilities, summed
    rounds: jax.Array  # cached calls after the prefill
    accepted: jax.Array  # drafts accepted, over rows and rounds


def _cached(model, params, cache, tokens_CxK, positions_CxK, segments_CxK=None):
    """One cached call of the model -> (logits [C, K, V], the decoder's output [C, K, D], cache)."""
    with kernels.installed():
        logits, mutated = model.apply(
            {"params": params, "cache": cache}, tokens_CxK, positions_CxK, segments_CxK, decode=True,
            mutable=["cache", mtp.MTP],
        )  # fmt: skip
    return logits, mutated[mtp.MTP]["hidden"][0], mutated["cache"]


def _forget(cache, first: jax.Array, kept_CxK):
    """The cache with the slots first .. first + K - 1 emptied where kept_CxK is False (their position -1)."""

    def forget(path, leaf):
        if path[-1].key != kv_cache.POSITIONS:
            return leaf
        slots = jax.lax.dynamic_slice_in_dim(leaf, first, kept_CxK.shape[1], axis=-1)
        return jax.lax.dynamic_update_slice_in_dim(leaf, jnp.where(kept_CxK, slots, -1), first, axis=-1)

    return jax.tree_util.tree_map_with_path(forget, cache)


def _write(buffer_CxT, values_CxK, start_C):
    """buffer[c, start_c + k] = values[c, k] for every row (a row's own offset)."""
    return jax.vmap(lambda b, v, s: jax.lax.dynamic_update_slice_in_dim(b, v, s, axis=0))(
        buffer_CxT, values_CxK, start_C
    )


def draft(cfg, params, tokens_CxT, hidden_CxTxD, n_C):
    """The MTP modules' greedy drafts [C, D] of t_n .. t_{n+D-1}: module k at position n - 2 reads e_{n-2+k}, so each
    depth's input token is the draft before it, written into the tokens before the modules run again."""
    embed, modules = Embedder(cfg), mtp.Modules(cfg)
    c, t = tokens_CxT.shape
    pos_CxT = jnp.broadcast_to(jnp.arange(t), (c, t))
    ctx = {"mask": Segments(jnp.ones((c, t), jnp.int32), jnp.ones((c, t), jnp.int32)), "pos": pos_CxT}
    last_C, drafts = n_C - 2, []
    for k in range(cfg.mtp_depth):
        e_CxTxD = embed.apply({"params": params["embed"]}, tokens_CxT, method=Embedder.token_embedding)
        normed_CxTxD = modules.apply({"params": params["mtp"]}, hidden_CxTxD, e_CxTxD, ctx)[k]
        at_Cx1xD = jnp.take_along_axis(normed_CxTxD, last_C[:, None, None], axis=1)
        token_C = jnp.argmax(embed.apply({"params": params["embed"]}, at_Cx1xD, method=Embedder.logits)[:, 0], -1)
        drafts.append(token_C.astype(jnp.int32))
        tokens_CxT = _write(tokens_CxT, token_C[:, None].astype(jnp.int32), last_C + k + 2)
    return jnp.stack(drafts, axis=1)


def speculative_ids(model, params, strategy: Strategy, prompt_CxP, lengths_C):
    """Left-padded prompts [C, P] with their lengths [C] -> (tokens [C, max_new_tokens], log-probabilities [C],
    rounds, drafts accepted), greedy, in one compiled call; `params` as trained (the modules run on them, the
    model on for_decoding's)."""
    check_model(model, strategy)
    if kernels.is_decoding(params):
        raise ValueError("speculative decoding's MTP modules read the parameters as trained, not for_decoding's")
    decoding, decoding_params = for_decoding(model, params, prompt_CxP.shape[0])
    return _generate(decoding, decoding_params, params, strategy, prompt_CxP, lengths_C)


@functools.partial(jax.jit, static_argnums=(0, 3))
def _generate(model, decoding_params, params, strategy: Strategy, prompt_CxP, lengths_C):
    cfg, (c, p), d, new = model.cfg, prompt_CxP.shape, model.cfg.mtp_depth, strategy.max_new_tokens
    t = p + new + d + 1
    first_C = p - lengths_C
    positions_CxP = jnp.maximum(jnp.arange(p)[None, :] - first_C[:, None], 0)
    segments_CxP = (jnp.arange(p)[None, :] >= first_C[:, None]).astype(jnp.int32)
    cache = init_cache(model, c, p + (d + 1) * new)
    logits_CxPxV, hidden_CxPxD, cache = _cached(model, decoding_params, cache, prompt_CxP, positions_CxP, segments_CxP)
    # the prompts at their positions (row c's token i at prompt column first_c + i), then the first choice
    at_CxT = jnp.clip(first_C[:, None] + jnp.arange(t)[None, :], 0, p - 1)
    tokens_CxT = jnp.take_along_axis(prompt_CxP, at_CxT, axis=1)
    hidden_CxTxD = jnp.take_along_axis(hidden_CxPxD, at_CxT[..., None], axis=1)
    logp_CxV = jax.nn.log_softmax(logits_CxPxV[:, -1])
    first_token_C = jnp.argmax(logp_CxV, -1).astype(jnp.int32)
    tokens_CxT = _write(tokens_CxT, first_token_C[:, None], lengths_C)
    n_C = lengths_C + 1
    state = Rounds(
        n_C=n_C,
        tokens_CxT=tokens_CxT,
        hidden_CxTxD=hidden_CxTxD,
        drafts_CxD=draft(cfg, params, tokens_CxT, hidden_CxTxD, n_C),
        cache=cache,
        stopped_C=is_eos(strategy, first_token_C) | (new == 1),
        logp_C=jnp.take_along_axis(logp_CxV, first_token_C[:, None], axis=1)[:, 0],
        rounds=jnp.zeros((), jnp.int32),
        accepted=jnp.zeros((), jnp.int32),
    )

    def body(s: Rounds) -> Rounds:
        last_C = jnp.take_along_axis(s.tokens_CxT, s.n_C[:, None] - 1, axis=1)
        fed_CxK = jnp.concatenate([last_C, s.drafts_CxD], axis=1)
        positions_CxK = s.n_C[:, None] - 1 + jnp.arange(d + 1)
        first = filled(s.cache)
        logits_CxKxV, hidden_CxKxD, cache = _cached(model, decoding_params, s.cache, fed_CxK, positions_CxK)
        greedy_CxK = jnp.argmax(logits_CxKxV, -1).astype(jnp.int32)
        agree_CxD = jnp.cumprod(s.drafts_CxD == greedy_CxK[:, :d], axis=1)
        a_C = jnp.where(s.stopped_C, 0, agree_CxD.sum(1))
        # g_0 .. g_a are new, up to the first EOS and max_new_tokens; a stopped row keeps nothing
        room_C = lengths_C + new - s.n_C
        k_K = jnp.arange(d + 1)
        eos_CxK = is_eos(strategy, greedy_CxK) & (k_K <= a_C[:, None])
        first_eos_C = jnp.where(eos_CxK.any(1), jnp.argmax(eos_CxK, 1), d + 1)
        kept_C = jnp.where(s.stopped_C, 0, jnp.minimum(jnp.minimum(a_C + 1, room_C), first_eos_C + 1))
        logp_CxK = jnp.take_along_axis(jax.nn.log_softmax(logits_CxKxV), greedy_CxK[..., None], axis=-1)[..., 0]
        return Rounds(
            n_C=s.n_C + kept_C,
            tokens_CxT=_write(s.tokens_CxT, greedy_CxK, s.n_C),
            hidden_CxTxD=_write(s.hidden_CxTxD, hidden_CxKxD, s.n_C - 1),
            drafts_CxD=s.drafts_CxD,  # replaced below, from the new tokens and hidden states
            cache=_forget(cache, first, (k_K[None, :] <= a_C[:, None]) & ~s.stopped_C[:, None]),
            stopped_C=s.stopped_C | (kept_C == room_C) | (first_eos_C < kept_C),
            logp_C=s.logp_C + jnp.where(k_K[None, :] < kept_C[:, None], logp_CxK, 0.0).sum(1),
            rounds=s.rounds + 1,
            accepted=s.accepted + jnp.maximum(kept_C - 1, 0).sum(),
        )

    def step(s: Rounds) -> Rounds:
        s = body(s)
        return s.replace(drafts_CxD=draft(cfg, params, s.tokens_CxT, s.hidden_CxTxD, s.n_C))

    state = jax.lax.while_loop(lambda s: ~s.stopped_C.all(), step, state)
    out_CxN = jnp.take_along_axis(state.tokens_CxT, lengths_C[:, None] + jnp.arange(new), axis=1)
    return out_CxN, state.logp_C, state.rounds, state.accepted
