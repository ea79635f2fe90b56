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
cache holds P + (D + 1) x rounds slots, grown through 16, 32, ... rounds. Each module has a KV cache of its own, the
same way: module k's entry at position j is final once t_{j+k} is known; the entries whose input is still a draft are
computed for the draft's query and emptied after it, so module k is fed D + k positions a round (its cache
P + 2D x rounds slots). A local layer's ring buffer and a Gated DeltaNet layer's state cannot forget a refused draft:
such models are refused.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from txjax.decode import kernels
from txjax.decode.cache import bucket_lengths, filled, for_decoding, grow, init_cache
from txjax.decode.strategy import Strategy, is_eos
from txjax.families import DECODER_LM, family_of
from txjax.model import kv_cache, mtp, precision
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
    """The loop's carry: C rows, T positions (a row's tokens at their positions: prompt, generated, room for drafts)."""

    n_C: jax.Array  # tokens known (prompt and generated)
    tokens_CxT: jax.Array
    hidden: list  # D arrays [C, T, D]: h^0 (the decoder's output), h^1 .. h^{D-1} (the modules'), final up to n - 2
    drafts_CxD: jax.Array
    cache: Any  # the model's
    caches: list  # each module's
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


def _depth(cfg, params, cache, k: int, h_CxWxD, tokens_CxW, positions_CxW, segments_CxW):
    """Module k's cached call over W positions (its inputs h^{k-1} and the tokens k places on) -> (h^k [C, W, D],
    Norm_k(h^k) [C, W, D], cache). Decoding's layout, as the model's calls."""
    variables = {"params": params["embed"]}
    with kernels.installed(), precision.matmul_precision(cfg.matmul_precision, cfg.compute_dtype):
        e_CxWxD = Embedder(cfg).apply(variables, tokens_CxW, method=Embedder.token_embedding)
        ctx = {"mask": Segments(segments_CxW, segments_CxW), "pos": positions_CxW}
        variables = {"params": params["mtp"][f"depth_{k}"]} | ({} if cache is None else {"cache": cache})
        (h_CxWxD, normed_CxWxD), mutated = mtp.Depth(cfg, decode=True).apply(
            variables, h_CxWxD, e_CxWxD, ctx, mutable=["cache"]
        )
    return h_CxWxD, normed_CxWxD, mutated["cache"]


def _depth_caches(cfg, params, rows: int, slots: int) -> list:
    """Each module's empty cache of `slots` slots (what its first cached call of that many positions creates)."""
    c_x_s = jnp.zeros((rows, slots), jnp.int32)
    h_CxSxD = jnp.zeros((rows, slots, cfg.d_model), jnp.float32)
    shapes = [jax.eval_shape(lambda k=k: _depth(cfg, params, None, k, h_CxSxD, c_x_s, c_x_s, c_x_s + 1)[2])
              for k in range(1, cfg.mtp_depth + 1)]  # fmt: skip
    empty = lambda path, leaf: jnp.full(leaf.shape, kv_cache.empty_value(path[-1].key), leaf.dtype)
    return [jax.tree_util.tree_map_with_path(empty, shape) for shape in shapes]


def _draft(cfg, params, s: Rounds, start, width, active_C) -> Rounds:
    """The modules' greedy drafts of t_n .. t_{n+D-1} (s.n_C = n), each module fed the positions from `start(k)`
    [C], `width(k)` of them, that its cache lacks: module k's entry at j is final once t_{j+k} is known (j <= n-1-k),
    read and emptied after the call for j up to n - 2 (its input a draft), never fed past n - 2 (the last h known).
    Module k's query at n - 2 reads e_{n-2+k}: the draft before it, written into the tokens first."""
    rows_C, t = jnp.arange(s.n_C.shape[0]), s.tokens_CxT.shape[1]
    last_C, caches, hidden, tokens_CxT, drafts = s.n_C - 2, list(s.caches), list(s.hidden), s.tokens_CxT, []
    for k in range(1, cfg.mtp_depth + 1):
        j_CxW = start(k)[:, None] + jnp.arange(width(k))
        fed_CxW = (j_CxW >= 0) & (j_CxW <= last_C[:, None]) & active_C[:, None]
        at_CxW = jnp.clip(j_CxW, 0, t - 1)
        h_in_CxWxD = jnp.take_along_axis(hidden[k - 1], at_CxW[..., None], axis=1)
        ahead_CxW = jnp.take_along_axis(tokens_CxT, jnp.clip(j_CxW + k, 0, t - 1), axis=1)
        first = filled(caches[k - 1])
        h_CxWxD, normed_CxWxD, cache = _depth(
            cfg,
            params,
            caches[k - 1],
            k,
            h_in_CxWxD,
            ahead_CxW,
            jnp.minimum(at_CxW, cfg.max_len - 1),
            fed_CxW.astype(jnp.int32),
        )
        caches[k - 1] = _forget(cache, first, fed_CxW & (j_CxW <= (s.n_C - 1 - k)[:, None]))
        if k < cfg.mtp_depth:  # the next module's input; a position not fed is dropped (index t: out of range)
            hidden[k] = hidden[k].at[rows_C[:, None], jnp.where(fed_CxW, j_CxW, t)].set(h_CxWxD, mode="drop")
        query_C = jnp.clip(last_C - start(k), 0, width(k) - 1)
        normed_Cx1xD = jnp.take_along_axis(normed_CxWxD, query_C[:, None, None], axis=1)
        with kernels.installed():
            logits_Cx1xV = Embedder(cfg).apply({"params": params["embed"]}, normed_Cx1xD, method=Embedder.logits)
        drafts.append(jnp.argmax(logits_Cx1xV[:, 0], -1).astype(jnp.int32))
        tokens_CxT = tokens_CxT.at[rows_C, s.n_C - 1 + k].set(drafts[-1], mode="drop")
    return s.replace(drafts_CxD=jnp.stack(drafts, axis=1), caches=caches, hidden=hidden)


def speculative_ids(model, params, strategy: Strategy, prompt_CxP, lengths_C):
    """Left-padded prompts [C, P] with their lengths [C] -> (tokens [C, max_new_tokens], log-probabilities [C],
    rounds, drafts accepted), greedy, in one compiled call."""
    check_model(model, strategy)
    # each call feeds D + 1 tokens a row: the kernels of several rows' layout (one row's products a token at a time)
    rows = prompt_CxP.shape[0] * (model.cfg.mtp_depth + 1)
    return _generate(*for_decoding(model, params, rows), strategy, prompt_CxP, lengths_C)


@functools.partial(jax.jit, static_argnums=(0, 2))
def _generate(model, params, strategy: Strategy, prompt_CxP, lengths_C):
    cfg, (c, p), d, new = model.cfg, prompt_CxP.shape, model.cfg.mtp_depth, strategy.max_new_tokens
    t = p + new + 2 * d + 1  # a window's last token: n - 1 + D + k <= P + max_new_tokens + 2D
    first_C = p - lengths_C
    positions_CxP = jnp.maximum(jnp.arange(p)[None, :] - first_C[:, None], 0)
    segments_CxP = (jnp.arange(p)[None, :] >= first_C[:, None]).astype(jnp.int32)
    # the caches grow as the rounds do (16, 32, ... rounds, as search.py's by slots), so that a call attends over
    # about the slots filled: the model's D + 1 slots a round, each module's at most 2D
    phases = bucket_lengths(1, new - 1, 16)
    cache = init_cache(model, c, p + (d + 1) * phases[0])
    logits_CxPxV, hidden_CxPxD, cache = _cached(model, params, cache, prompt_CxP, positions_CxP, segments_CxP)
    # the prompts at their positions (row c's token i at prompt column first_c + i), then the first choice
    at_CxT = jnp.clip(first_C[:, None] + jnp.arange(t)[None, :], 0, p - 1)
    tokens_CxT = jnp.take_along_axis(prompt_CxP, at_CxT, axis=1)
    hidden_CxTxD = jnp.take_along_axis(hidden_CxPxD, at_CxT[..., None], axis=1)
    logp_CxV = jax.nn.log_softmax(logits_CxPxV[:, -1])
    first_token_C = jnp.argmax(logp_CxV, -1).astype(jnp.int32)
    state = Rounds(
        n_C=lengths_C + 1,
        tokens_CxT=_write(tokens_CxT, first_token_C[:, None], lengths_C),
        hidden=[hidden_CxTxD] + [jnp.zeros_like(hidden_CxTxD)] * (d - 1),
        drafts_CxD=jnp.zeros((c, d), jnp.int32),
        cache=cache,
        caches=_depth_caches(cfg, params, c, p + 2 * d * phases[0]),
        stopped_C=is_eos(strategy, first_token_C) | (new == 1),
        logp_C=jnp.take_along_axis(logp_CxV, first_token_C[:, None], axis=1)[:, 0],
        rounds=jnp.zeros((), jnp.int32),
        accepted=jnp.zeros((), jnp.int32),
    )
    # the modules' caches filled over the prompt's positions, then D + k positions a round (from module k's first
    # entry not yet final, n - k of the n before the round)
    state = _draft(cfg, params, state, lambda k: jnp.zeros((c,), jnp.int32), lambda k: p, jnp.ones((c,), bool))

    def step(s: Rounds) -> Rounds:
        n_C, active_C = s.n_C, ~s.stopped_C
        last_C = jnp.take_along_axis(s.tokens_CxT, n_C[:, None] - 1, axis=1)
        fed_CxK = jnp.concatenate([last_C, s.drafts_CxD], axis=1)
        # a draft past the context (the last rounds of a generation up to max_len) is never kept: segment 0, no query
        # sees it, at the last position (a learned position table has no row past it)
        positions_CxK = n_C[:, None] - 1 + jnp.arange(d + 1)
        inside_CxK = (positions_CxK < cfg.max_len).astype(jnp.int32)
        first = filled(s.cache)
        logits_CxKxV, hidden_CxKxD, cache = _cached(
            model, params, s.cache, fed_CxK, jnp.minimum(positions_CxK, cfg.max_len - 1), inside_CxK
        )
        greedy_CxK = jnp.argmax(logits_CxKxV, -1).astype(jnp.int32)
        a_C = jnp.where(active_C, jnp.cumprod(s.drafts_CxD == greedy_CxK[:, :d], axis=1).sum(1), 0)
        # g_0 .. g_a are new, up to the first EOS and max_new_tokens; a stopped row keeps nothing
        room_C = lengths_C + new - n_C
        k_K = jnp.arange(d + 1)
        eos_CxK = is_eos(strategy, greedy_CxK) & (k_K <= a_C[:, None])
        first_eos_C = jnp.where(eos_CxK.any(1), jnp.argmax(eos_CxK, 1), d + 1)
        kept_C = jnp.where(active_C, jnp.minimum(jnp.minimum(a_C + 1, room_C), first_eos_C + 1), 0)
        logp_CxK = jnp.take_along_axis(jax.nn.log_softmax(logits_CxKxV), greedy_CxK[..., None], axis=-1)[..., 0]
        s = s.replace(
            n_C=n_C + kept_C,
            tokens_CxT=_write(s.tokens_CxT, greedy_CxK, n_C),
            hidden=[_write(s.hidden[0], hidden_CxKxD, n_C - 1), *s.hidden[1:]],
            cache=_forget(cache, first, (k_K[None, :] <= a_C[:, None]) & active_C[:, None]),
            stopped_C=s.stopped_C | (kept_C == room_C) | (first_eos_C < kept_C),
            logp_C=s.logp_C + jnp.where(k_K[None, :] < kept_C[:, None], logp_CxK, 0.0).sum(1),
            rounds=s.rounds + 1,
            accepted=s.accepted + jnp.maximum(kept_C - 1, 0).sum(),
        )
        return _draft(cfg, params, s, lambda k: n_C - k, lambda k: d + k, active_C)

    for rounds in phases:
        state = state.replace(
            cache=grow(state.cache, p + (d + 1) * rounds), caches=[grow(x, p + 2 * d * rounds) for x in state.caches]
        )
        state = jax.lax.while_loop(lambda s, r=rounds: ~s.stopped_C.all() & (s.rounds < r), step, state)
    out_CxN = jnp.take_along_axis(state.tokens_CxT, lengths_C[:, None] + jnp.arange(new), axis=1)
    return out_CxN, state.logp_C, state.rounds, state.accepted
