"""Multi-head attention, the module.

    MultiHead(Q, K, V) = Concat(head_1..head_h) W^O,  head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)
    gated (output_gate, Qwen3-Next):                  head_i = sigmoid(Q W_i^G) * Attention(...)

`MultiHeadAttention` projects with per-head weights written as einsums and runs the heads through
txjax.model.attention's `attend` (the scores' terms of txjax.model.score over all heads, or a fused kernel). The same
module serves self-attention (kv = x), masked self-attention (a causal mask, and a local window: txjax.model.masks) and
cross-attention (kv = encoder output, padding mask only). In decode mode it keeps a KV cache (txjax.model.kv_cache,
its one schema): the full one, a local layer's ring buffer of `window` slots, the encoder's keys and values.

What runs when decoding: five of its methods (project_qkv, heads_in, project_out, update_cache, attend) are
declared replaceable in txjax/model/replaceable.py (REPLACEABLE, their signatures held by
tests/test_decode_contract.py). Generation (txjax.decode.cache.extend) runs them replaced by txjax.decode.kernels'
LAYOUT (the same equations on decoding_params' fused, out-major parameters and a [B*KV, K, S] cache); a prefix LM's
prefill also widens update_cache's mask (txjax.families.prefix_lm.PREFILL). Everything else is this file's code.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from txjax.model import adapters, blockwise, norms, positional, precision, roles, score
from txjax.model.attention import attend, segment_backend
from txjax.model.config import PLAIN_LAYER
from txjax.model.kv_cache import append_kv_cache, cross_kv_cache, window_kv_cache
from txjax.model.masks import segment_mask
from txjax.model.norms import rms_norm
from txjax.model.score import Spec


class MultiHeadAttention(nn.Module):
    """Multi-head attention with h heads and 3h+1 weight matrices (W_i^Q, W_i^K, W_i^V per head, one W^O).

    Weights: query [d_model, heads, d_k], key/value [d_model, kv_heads, d_k], out [heads, d_k, d_model] (and the
    output gate's gate [d_model, heads, d_k]); none has a sequence axis. Self-attention unless `cross` (keys/values
    from the encoder output). In decode mode (Flax's wmt style: the same parameters) self-attention appends the new
    tokens' keys/values to a cache and attends over it; cross-attention caches the encoder's keys/values at the
    first call. Each step is a method; those declared in
    txjax/model/replaceable.py are what a decoding layout replaces (the module docstring says which run when).
    """

    num_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: jnp.dtype = jnp.float32
    use_bias: bool = False
    qkv_bias: bool = False  # biases on query/key/value only (Qwen2); use_bias puts them on all four
    dropout: float = 0.0
    score: Spec = Spec()  # the scores' static terms (txjax.model.score: scale, soft cap, ALiBi, T5's distance)
    impl: str = "reference"  # attend's: 'reference' | 'fused' | 'cudnn', or 'blockwise' (segment_backend)
    block_sizes: tuple[int, int] = (256, 256)  # blockwise's (queries, keys) per block
    rope: positional.Rope | None = None  # rotate q and k (RoPE) when set
    local_rope: positional.Rope | None = None  # a local layer's (window > 0) own RoPE, if not `rope`
    qk_norm: bool = False  # RMSNorm of q and k over each head's d_k before the scores (Dehghani et al. 2023)
    qk_norm_all_heads: bool = False  # qk_norm over all heads' channels at once, gains [heads, d_k] (OLMoE)
    norm_eps: float = 1e-5
    qk_l2_norm: bool = False  # the RoPE layers' q and k over their RMS, no gain (Llama 4), after RoPE
    chunk: int = 0  # the RoPE layers attend within blocks of this many positions (masks.chunk_mask; Llama 4), 0: none
    temperature: tuple[float, int] = (0.0, 1)  # NoPE layers' query temperature (scale, floor_scale; Llama 4), 0: off
    norm_offset: bool = False  # the q/k norms' gains as 1 + w (Gemma 3: txjax.model.norms)
    output_gate: bool = False  # each head's output times sigmoid(x W_i^G) before W^O (Qwen3-Next's gated attention)
    sow_weights: bool = False
    cross: bool = False  # keys/values from another sequence (the encoder output)
    init_std: float = 0.02  # W^Q, W^K, W^V ~ N(0, init_std^2)
    out_init_std: float = 0.02  # W^O (GPT-2 scales it by 1/sqrt(2 * layers))

    @nn.compact
    def __call__(
        self,
        x_BxLxD,
        mask,
        *,
        q_pos,
        kv=None,
        k_pos=None,
        causal=False,
        layer=PLAIN_LAYER,
        deterministic=True,
        decode=False,
        relative_table=None,
    ):
        """x [B, Lq, D] queries; kv [B, Lk, D] the keys' sequence for cross-attention (self-attention: x; in decode
        mode None reuses the encoder keys/values cached by the first call); mask bool [B, 1, Lq, Lk], None or
        blockwise.Segments (segment ids: read as they are by segment_backend's choice, else made dense); q_pos
        [B, Lq], k_pos [B, Lk] explicit positions (RoPE, ALiBi); causal: also the causal order; layer: this layer's
        own settings (config.LayerAttention: its local window, masks.window_mask, an int, 0 = global, or a scanned
        layer's traced scalar; its RoPE flag, which also says where `chunk` applies); relative_table
        [buckets, H]: T5's bucketed relative bias (positional.relative_bias; past-only buckets when causal).
        -> [B, Lq, D]."""
        bidirectional, k_pos, window = not causal, q_pos if k_pos is None else k_pos, layer.window
        chunk = _where(layer.rope, self.chunk, 0) if self.chunk else 0  # Llama 4 chunks its RoPE layers alone
        by_segments, mask = self.backend(mask, decode, window, chunk)
        q_BxLxHxK, k, v = self.project_qkv(x_BxLxD, kv if self.cross else x_BxLxD)
        if self.rope is not None and layer.rope is not False:  # a static NoPE layer rotates nothing
            theta, factor = positional.layer_rope(self.rope, self.local_rope, window, self.head_dim)
            if not isinstance(layer.rope, bool):  # a scanned layer's traced flag: angle 0 (cos 1, sin 0) if off
                theta, factor = theta * layer.rope, jnp.where(layer.rope > 0, factor, 1.0)
            q_BxLxHxK = positional.rotate(q_BxLxHxK, *positional.rope_tables(q_pos, theta, factor))
            k = positional.rotate(k, *positional.rope_tables(k_pos, theta, factor))
        if self.qk_l2_norm and layer.rope is not False:  # a RoPE layer's (a scanned layer's flag: where it is on)
            q_BxLxHxK, k = (_where(layer.rope, norms.l2_norm(t, self.norm_eps), t) for t in (q_BxLxHxK, k))
        if self.temperature[0] and layer.rope is not True:  # a NoPE layer's
            hotter = q_BxLxHxK * positional.temperature(q_pos, *self.temperature).astype(q_BxLxHxK.dtype)
            q_BxLxHxK = _where(layer.rope, q_BxLxHxK, hotter)
        if decode:  # the cache's mask holds the causal order of its slots
            k, v, k_pos, mask = self.update_cache(k, v, q_pos, k_pos, mask, window)
            causal = False
        out_BxLxHxK = self.heads(
            q_BxLxHxK, k, v, mask, q_pos, k_pos, by_segments,
            causal=causal, window=window, deterministic=deterministic, relative_table=relative_table,
            bidirectional=bidirectional, chunk=chunk,
        )  # fmt: skip
        if self.output_gate:  # W_i^G [D, heads, K] read from the queries' side, as W_i^Q is
            out_BxLxHxK = out_BxLxHxK * jax.nn.sigmoid(self.heads_in("gate", self.num_heads, x_BxLxD))
        return self.project_out(out_BxLxHxK, x_BxLxD.shape[-1])

    def backend(self, mask, decode, window=0, chunk=0):
        """segment_backend's choice for this call, and the mask as that backend reads it (blockwise.Segments made
        dense for the dense paths)."""
        needs_scores = decode or self.sow_weights
        by_segments = segment_backend(
            self.impl, mask, needs_scores, self.block_sizes, window, self.score.softcap, chunk
        )
        if isinstance(mask, blockwise.Segments) and by_segments is None:  # the other paths read the dense mask
            mask = segment_mask(*mask)
        return by_segments, mask

    def heads(
        self, q_BxLxHxK, k, v, mask, q_pos, k_pos, by_segments, *, causal, window, deterministic, relative_table,
        bidirectional, chunk=0,
    ):  # fmt: skip
        """The heads' attention over the scores' terms (txjax.model.score) by the backend `backend` chose: q
        [B, L, H, K], k [B, S, KV, K], v [B, S, KV, V] -> [B, L, H, V]; the scale is the one of head_dim."""
        if by_segments is not None and relative_table is not None:
            raise ValueError("model.positional='relative_buckets' needs model.attention_impl=reference (or auto)")
        heads_H = score.head_terms(self)
        if by_segments is not None:  # masks and ALiBi made block by block (ring step by ring step)
            scale = self.score.factor(self.head_dim)  # the soft cap is bound into by_segments
            return by_segments(q_BxLxHxK, k, v, mask, q_pos, k_pos, causal=causal, heads_H=heads_H, scale=scale)
        by_index = self.impl != "reference"  # the fused kernels' is_causal and local_window_size
        terms = score.dense_terms(
            self.score, self.head_dim, heads_H, q_pos, k_pos, mask,
            causal=causal, window=window, by_index=by_index, relative_table=relative_table, bidirectional=bidirectional,
            chunk=chunk,
        )  # fmt: skip
        return self.attend(q_BxLxHxK, k, v, terms, deterministic)

    def heads_in(self, name, heads, x_BxLxD):
        """x W [+ b]: W [D, heads, K] ~ N(0, init_std^2) -> [B, L, heads, K] (W_i^Q, W_i^K, W_i^V or W_i^G)."""
        spec = ("embed", "heads" if name in ("query", "qkv", "gate") else "kv_heads", "kv")
        init = roles.init(nn.initializers.normal(self.init_std), spec, roles.QKV)
        w = self.param(name, init, (x_BxLxD.shape[-1], heads, self.head_dim))
        y = precision.einsum("bld,dhk->blhk", x_BxLxD.astype(self.dtype), w.astype(self.dtype))
        y = adapters.low_rank(self, (name,), x_BxLxD, y, inputs=1)  # a LoRA train step's with train.lora_dropout
        if not (self.use_bias or self.qkv_bias):
            return y
        zeros = roles.init(nn.initializers.zeros, spec[1:], roles.BIAS)
        return y + self.param(f"{name}_bias", zeros, (heads, self.head_dim)).astype(self.dtype)

    def norm(self, name, t):
        """QK-norm: g * t / sqrt(mean_k(t^2) + eps) over each head's d_k (qk_norm_all_heads: over all heads' [H, d_k]),
        in float32 (identity unless qk_norm; the gain 1 + w with norm_offset)."""
        if not self.qk_norm:
            return t
        axes = (("heads" if name == "query_norm" else "kv_heads"), "kv") if self.qk_norm_all_heads else "kv"
        return rms_norm(self.norm_eps, self.norm_offset, axes, name)(t).astype(t.dtype)

    def project_qkv(self, x_BxLxD, kv_BxSxD):
        """-> q [B, L, H, K], k/v [B, S, KV, K] (None for kv None: a cross-attention decode step)."""
        q_BxLxHxK = self.norm("query_norm", self.heads_in("query", self.num_heads, x_BxLxD))
        if kv_BxSxD is None:
            return q_BxLxHxK, None, None
        k_BxSxGxK = self.norm("key_norm", self.heads_in("key", self.num_kv_heads, kv_BxSxD))
        return q_BxLxHxK, k_BxSxGxK, self.heads_in("value", self.num_kv_heads, kv_BxSxD)

    def update_cache(self, k_new, v_new, q_pos, k_pos, mask, window=0):
        """Decode mode: the keys/values to attend over, their positions and mask (cross_kv_cache; window_kv_cache for
        a static local window, whose band the caller adds; else append_kv_cache)."""
        if self.cross:
            return *cross_kv_cache(self, k_new, v_new), k_pos, mask
        if isinstance(window, int) and window > 0:
            return window_kv_cache(self, k_new, v_new, q_pos, mask, window)
        return append_kv_cache(self, k_new, v_new, q_pos, mask)

    def attend(self, q_BxLxHxK, k, v, terms, deterministic):
        """The heads' attention (the module-level `attend`) over the scores' terms (score.Terms), with dropout on the
        weights and their sowing."""
        keep = None
        if self.dropout > 0 and not deterministic:  # one mask per head
            shape = (q_BxLxHxK.shape[0], self.num_heads, q_BxLxHxK.shape[1], k.shape[1])
            keep = jax.random.bernoulli(self.make_rng("dropout"), 1.0 - self.dropout, shape) / (1.0 - self.dropout)
        out_BxLxHxK, probs_BxHxLxS = attend(q_BxLxHxK, k, v, terms, keep=keep, impl=self.impl, weights=self.sow_weights)
        if self.sow_weights:
            self.sow("intermediates", "attention_weights", probs_BxHxLxS)
        return out_BxLxHxK

    def project_out(self, out_BxLxHxK, d_model):
        """Concat(head_1..head_h) W^O [+ b]: W^O [H, K, D] -> [B, L, D]."""
        spec, shape = ("heads", "kv", "embed"), (self.num_heads, out_BxLxHxK.shape[-1], d_model)
        w_out = self.param("out", roles.init(nn.initializers.normal(self.out_init_std), spec, roles.OUT), shape)
        y_BxLxD = precision.einsum("blhk,hkd->bld", out_BxLxHxK.astype(self.dtype), w_out.astype(self.dtype))
        y_BxLxD = adapters.low_rank(self, ("out",), out_BxLxHxK, y_BxLxD, inputs=2)
        if not self.use_bias:
            return y_BxLxD
        zeros = roles.init(nn.initializers.zeros, ("embed",), roles.BIAS)
        return y_BxLxD + self.param("out_bias", zeros, (d_model,)).astype(self.dtype)


def _where(on, new, old):
    """new where a layer's flag is on, else old: a Python bool picks one, a scanned layer's traced flag selects."""
    if isinstance(on, bool):
        return new if on else old
    return jnp.where(on, new, old)
