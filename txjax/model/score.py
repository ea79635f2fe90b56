"""The attention scores, written once: every term between q k^T and the weights that multiply v.

    weights = softmax over keys of  mask( soft_cap(q k^T * scale, c) + bias )

- scale: 1/sqrt(d) (the paper's, d = d_k or Gemma's query_pre_attn_scalar), 1 or 1/d (muP): `Spec.factor`
- soft-capping: c tanh(s / c) (Gemma 2's attn_logit_softcapping; c = 0 off)
- positional biases: ALiBi's -m_h |i - j| and T5's learned bucketed table (txjax.model.positional)
- masks (True = may attend; txjax.model.masks): padding and packed segments, prefix LM, causal order and a local
  window, on explicit positions (or by index for the fused kernels' is_causal / local_window_size), and chunked
  attention's blocks (Llama 4), on explicit positions
- attention sinks (GPT-OSS): a learned logit per head in the softmax's denominator, softmax over [scores, sink_h]
  with the sink's column dropped: a head may give its keys less than all of its weight; in the online softmax of
  blockwise attention the running max and sum start from it (online_start)

Two forms read these terms. `weights` takes a dense call's `Terms` (its arrays in one canonical layout, [B|1, H|1,
L, S]) and the raw products q k^T in any backend's layout, with that backend's `arrange` of a canonical array:
the reference (txjax.model.attention) and every decoding layout (txjax.decode.kernels) call it, so a term added to
Terms reaches them all. `tile` is the same terms for one (query block, key block) tile of blockwise/flash attention
and ring attention (txjax.model.blockwise), made from segment ids and positions. The fused kernels
(jax.nn.dot_product_attention) take the terms they can express; `FUSED_LACKS` names the config fields they cannot,
refused by ModelConfig and skipped by attention_impl=auto.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import struct

from txjax.model import masks, positional, roles
from txjax.model.activations import soft_cap
from txjax.model.masks import NEG_INF

# model fields that jax.nn.dot_product_attention cannot express: each must be off (0) with attention_impl fused or
# cudnn, and makes 'auto' take the reference
FUSED_LACKS = ("attention_softcap", "attention_sinks")


@dataclasses.dataclass(frozen=True)
class Spec:
    """A layer's static score terms (frozen, hashable: a field of MultiHeadAttention, built by spec_of)."""

    scale: str = "sqrt"  # 'sqrt' 1/sqrt(d) | 'none' 1 | 'linear' 1/d (muP)
    scale_dim: int = 0  # the d of the scale; 0 = d_k (Gemma's query_pre_attn_scalar sets another)
    softcap: float = 0.0  # c > 0: scores c tanh(s / c)
    alibi: bool = False  # ALiBi's bias -m_h |i - j| (self-attention)
    max_distance: int = 128  # T5's relative buckets: distances from it on share the last bucket
    sinks: bool = False  # a learned logit per head in the softmax's denominator (self-attention)
    multiplier: float = 1.0  # times the scale: DeepSeek's YaRN mscale^2 (positional.Rope.softmax_multiplier)

    def factor(self, head_dim: int) -> float:
        """The scores' scale for heads of head_dim channels."""
        d = self.scale_dim or head_dim
        return {"sqrt": d**-0.5, "none": 1.0, "linear": 1.0 / d}[self.scale] * self.multiplier


def spec_of(cfg, cross: bool) -> Spec:
    """A layer's Spec from the model config (ALiBi applies to self-attention only)."""
    return Spec(
        cfg.attention_scale,
        cfg.attention_scale_dim,
        cfg.attention_softcap,
        alibi=not cross and cfg.positional == "alibi",
        max_distance=cfg.relative_max_distance,
        sinks=not cross and cfg.attention_sinks,
        multiplier=1.0 if cross else cfg.rope.softmax_multiplier(cfg.rope_mscale_all_dim),
    )


def fused_lacks(cfg) -> list[str]:
    """The fields of FUSED_LACKS that the model config sets: the terms a fused kernel would drop."""
    return [f"model.{name}" for name in FUSED_LACKS if getattr(cfg, name)]


class Terms(struct.PyTreeNode):
    """One dense attention call's score terms; every array in the canonical layout [B|1, H|1, L, S] (a backend maps
    them all into its own with one `arrange`). causal and window apply by index (the fused kernels' form; the
    reference gets them as `mask` on explicit positions from `dense_terms`)."""

    scale: float = struct.field(pytree_node=False)
    softcap: float = struct.field(pytree_node=False, default=0.0)
    causal: bool = struct.field(pytree_node=False, default=False)
    window: int = struct.field(pytree_node=False, default=0)
    mask: jax.Array | None = None  # bool [B|1, 1, L, S]
    bias: jax.Array | None = None  # float32 [B|1, H, L, S]
    sinks: jax.Array | None = None  # float32 [1, H, 1, 1]


# the per-head terms that ring attention has no form for (it merges key shards by their logsumexp): what to set
RING_LACKS = {"slopes": "ALiBi bias: use another model.positional"}


def head_terms(module) -> dict:
    """The scores' per-head terms of an attention module (its `score` Spec, `num_heads`), {name: [H]}: ALiBi's
    slopes m_h (a constant), the sinks (a parameter, N(0, init_std^2), not weight-decayed). Both forms read them
    (dense_terms; tile and the online softmax, in the blockwise layout [G, R])."""
    heads = {"slopes": positional.alibi_slopes(module.num_heads)} if module.score.alibi else {}
    if module.score.sinks:
        init = roles.init(nn.initializers.normal(module.init_std), ("heads",), roles.BIAS)
        heads["sinks"] = module.param("sinks", init, (module.num_heads,)).astype(jnp.float32)
    return heads


def online_start(heads: dict, shape):
    """The online softmax's running max and sum [B, G, R, bq] before any key (blockwise): (NEG_INF, 0), or with
    sinks [G, R] (sink_h, 1): the sink's term e^(sink_h - m) in the sum from the start."""
    if heads and "sinks" in heads:
        return jnp.broadcast_to(heads["sinks"][..., None], shape), jnp.ones(shape)
    return jnp.full(shape, NEG_INF), jnp.zeros(shape)


def head_grads(heads: dict, lse, delta) -> dict:
    """The cotangents of the per-head terms [G, R] from the online form's logsumexp and rowsum(do * o), both
    [n, B, bq, G, R]: ALiBi's slopes are constants (zeros); a sink's weight p = e^(sink - lse) takes its share of
    every output, d sink = -sum over queries of p rowsum(do * o)."""
    grads = {name: jnp.zeros_like(t) for name, t in heads.items()}
    if "sinks" in heads:
        grads["sinks"] = -(jnp.exp(heads["sinks"] - lse) * delta).sum((0, 1, 2))
    return grads


def dense_terms(
    spec: Spec, head_dim, heads: dict, q_pos, k_pos, mask, *, causal, window, by_index, relative_table=None,
    bidirectional=True, chunk=0,
):  # fmt: skip
    """The Terms of a dense call: heads from head_terms; q_pos [B, L], k_pos [B, S]; mask bool [B|1, 1, L, S] or None;
    causal and a window (an int, 0 = global, or a traced scalar) on explicit positions, or by index where `by_index`
    (the fused kernels: then only a static window); relative_table [buckets, H]: T5's bias (past-only buckets unless
    `bidirectional`: a decode step's cache holds the causal order in its mask, the layer is still causal); chunk: the
    blocks of chunked attention (an int, 0 = none, or a traced scalar), a mask on explicit positions for every
    backend."""
    bias = None
    if "slopes" in heads:
        bias = positional.alibi_bias(q_pos, k_pos, heads["slopes"])
    if relative_table is not None:
        bias = positional.relative_bias(q_pos, k_pos, relative_table, bidirectional, spec.max_distance)
    if causal and not by_index:
        mask, causal = _and(mask, masks.causal_mask(q_pos, k_pos)), False
    if not (masks.is_global(window) or (causal and isinstance(window, int))):
        mask, window = _and(mask, masks.window_mask(q_pos, k_pos, window)), 0
    if not masks.is_global(chunk):
        mask = _and(mask, masks.chunk_mask(q_pos, k_pos, chunk))
    sinks = heads["sinks"][None, :, None, None] if "sinks" in heads else None
    return Terms(spec.factor(head_dim), spec.softcap, causal, window, mask, bias, sinks)


def _and(mask, other):
    return other if mask is None else mask & other


def logits(scale: float, softcap: float, raw):
    """soft_cap(raw * scale, softcap) of the products raw = q k^T (float32), and its derivative d s / d(raw * scale)
    (1 without a cap: blockwise's backward multiplies by it)."""
    s = soft_cap(raw * scale, softcap)
    return s, (1.0 - jnp.square(s / softcap) if softcap > 0 else 1.0)


def normalize(s, ok, sink=None):
    """softmax over the last axis of the scores s where ok (bool, broadcastable; None: all), float32; a row whose
    keys are all masked gets zeros, not a uniform row. sink (broadcastable to s[..., :1]): a logit in the
    denominator only, softmax over [s, sink] without the sink's column."""
    if sink is not None:
        s = s if ok is None else jnp.where(ok, s, NEG_INF)
        m = jnp.maximum(s.max(-1, keepdims=True), sink)
        e = jnp.exp(s - m)
        return e / (e.sum(-1, keepdims=True) + jnp.exp(sink - m))
    if ok is None:
        return jax.nn.softmax(s, axis=-1)
    probs = jax.nn.softmax(jnp.where(ok, s, NEG_INF), axis=-1)
    return jnp.where(ok.any(axis=-1, keepdims=True), probs, 0.0)


def weights(terms: Terms, raw, arrange=lambda t: t):
    """The attention weights of one dense call from raw = q k^T (float32) in a backend's layout ending [..., L, S]:
    `arrange` maps a canonical [B|1, H|1, L, S] array of `terms` into that layout (broadcastable to raw)."""
    s, _ = logits(terms.scale, terms.softcap, raw)
    if terms.bias is not None:
        s = s + arrange(terms.bias)
    ok = None if terms.mask is None else arrange(terms.mask)
    if terms.causal:
        n_q, n_k = raw.shape[-2:]
        order = jnp.tri(n_q, n_k, dtype=bool)
        if not masks.is_global(terms.window):
            order = order & masks.window_mask(jnp.arange(n_q)[None], jnp.arange(n_k)[None], terms.window)[0, 0]
        ok = order if ok is None else ok & order
    return normalize(s, ok, None if terms.sinks is None else arrange(terms.sinks))


def tile(scale: float, softcap: float, raw, q_seg, k_seg, q_pos, k_pos, *, causal, window, heads, chunk=None):
    """One (query block, key block) tile of blockwise/flash and ring attention: raw = q k^T [B, G, R, bq, bk]
    float32 (query head g * R + r), segment ids and positions [B, bq] / [B, bk], the causal order and a window
    (None = global, or a traced int32) on positions, the per-head terms {name: [G, R]} (head_terms) or None, and
    chunked attention's blocks (None = none, or a traced int32) -> the scores s, the allowed keys [B, 1, 1, bq, bk]
    and the soft cap's derivative (logits)."""
    s, capped = logits(scale, softcap, raw)
    if heads and "slopes" in heads:  # ALiBi's bias over heads [G, R]: -m_h |i - j|
        s = s + positional.alibi_bias(q_pos, k_pos, heads["slopes"].reshape(-1)).reshape(s.shape)
    ok = masks.segment_mask(q_seg, k_seg)
    if causal:
        ok = ok & masks.causal_mask(q_pos, k_pos)
    if window is not None:
        ok = ok & masks.window_mask(q_pos, k_pos, window)
    if chunk is not None:
        ok = ok & masks.chunk_mask(q_pos, k_pos, chunk)
    return s, ok[:, :, None], capped
