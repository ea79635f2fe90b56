"""Multi-head attention, the module.

    MultiHead(Q, K, V) = Concat(head_1..head_h) W^O,  head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

`MultiHeadAttention` projects with per-head weights written as einsums and runs the heads through
txjax.model.attention's `attend` (one head's equation, vmapped over the heads, or a fused kernel). The same module
serves self-attention (kv = x), masked self-attention (a causal mask, and a local window: txjax.model.masks) and
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

from txjax.model import blockwise, positional, precision, roles
from txjax.model.attention import attend, score_scale, segment_backend
from txjax.model.kv_cache import append_kv_cache, cross_kv_cache, window_kv_cache
from txjax.model.masks import causal_mask, is_global, segment_mask, window_mask
from txjax.model.norms import rms_norm


class MultiHeadAttention(nn.Module):
    """Multi-head attention with h heads and 3h+1 weight matrices (W_i^Q, W_i^K, W_i^V per head, one W^O).

    Weights: query [d_model, heads, d_k], key/value [d_model, kv_heads, d_k], out [heads, d_k, d_model]; none has a
    sequence axis. Self-attention unless `cross` (keys/values from the encoder output). In decode mode (Flax's wmt
    style: the same parameters) self-attention appends the new tokens' keys/values to a cache and attends over it;
    cross-attention caches the encoder's keys/values at the first call. Each step is a method; those declared in
    txjax/model/replaceable.py are what a decoding layout replaces (the module docstring says which run when).
    """

    num_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: jnp.dtype = jnp.float32
    use_bias: bool = False
    qkv_bias: bool = False  # biases on query/key/value only (Qwen2); use_bias puts them on all four
    dropout: float = 0.0
    scale: str = "sqrt"  # 'sqrt' (1/sqrt(d_k)) | 'none' | 'linear' (1/d_k): the scaling ablation
    scale_dim: int = 0  # the d of 1/sqrt(d) (1/d); 0 = d_k (Gemma's query_pre_attn_scalar)
    softcap: float = 0.0  # c > 0: scores soft-capped at c tanh(s / c) (Gemma 2)
    impl: str = "reference"  # attend's: 'reference' | 'fused' | 'cudnn', or 'blockwise' (segment_backend)
    block_sizes: tuple[int, int] = (256, 256)  # blockwise's (queries, keys) per block
    rope: positional.Rope | None = None  # rotate q and k (RoPE) when set
    local_rope: positional.Rope | None = None  # a local layer's (window > 0) own RoPE, if not `rope`
    alibi: bool = False
    max_distance: int = 128  # relative_table's: distances from it on share the last bucket (T5)
    qk_norm: bool = False  # RMSNorm of q and k over each head's d_k before the scores (Dehghani et al. 2023)
    qk_norm_all_heads: bool = False  # qk_norm over all heads' channels at once, gains [heads, d_k] (OLMoE)
    norm_eps: float = 1e-5
    norm_offset: bool = False  # the q/k norms' gains as 1 + w (Gemma 3: txjax.model.norms)
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
        window=0,
        deterministic=True,
        decode=False,
        relative_table=None,
    ):
        """x [B, Lq, D] queries; kv [B, Lk, D] the keys' sequence for cross-attention (self-attention: x; in decode
        mode None reuses the encoder keys/values cached by the first call); mask bool [B, 1, Lq, Lk], None or
        blockwise.Segments (segment ids: read as they are by segment_backend's choice, else made dense); q_pos
        [B, Lq], k_pos [B, Lk] explicit positions (RoPE, ALiBi); causal: also the causal order; window: a local
        window (masks.window_mask: an int, 0 = global, or a scanned layer's traced scalar); relative_table
        [buckets, H]: T5's bucketed relative bias (positional.relative_bias; past-only buckets when causal).
        -> [B, Lq, D]."""
        bidirectional = not causal
        k_pos = q_pos if k_pos is None else k_pos
        needs_scores = decode or self.sow_weights
        by_segments = segment_backend(self.impl, mask, needs_scores, self.block_sizes, window, self.softcap)
        if isinstance(mask, blockwise.Segments) and by_segments is None:  # the other paths read the dense mask
            mask = segment_mask(*mask)
        q_BxLxHxK, k, v = self.project_qkv(x_BxLxD, kv if self.cross else x_BxLxD)
        if self.rope is not None:
            theta, factor = positional.layer_rope(self.rope, self.local_rope, window, self.head_dim)
            q_BxLxHxK = positional.rotate(q_BxLxHxK, *positional.rope_tables(q_pos, theta, factor))
            k = positional.rotate(k, *positional.rope_tables(k_pos, theta, factor))
        if decode:  # the cache's mask holds the causal order of its slots
            k, v, k_pos, mask = self.update_cache(k, v, q_pos, k_pos, mask, window)
            causal = False
        if by_segments is not None and relative_table is not None:
            raise ValueError("model.positional='relative_buckets' needs model.attention_impl=reference (or auto)")
        if by_segments is not None:  # masks and ALiBi made block by block (ring step by ring step)
            slopes_H = positional.alibi_slopes(self.num_heads) if self.alibi else None
            scale = self.score_options()["scale"]  # the soft cap is bound into by_segments
            out_BxLxHxK = by_segments(
                q_BxLxHxK, k, v, mask, q_pos, k_pos, causal=causal, slopes_H=slopes_H, scale=scale
            )
            return self.project_out(out_BxLxHxK, x_BxLxD.shape[-1])
        bias_BxHxLxS = None
        if self.alibi:
            bias_BxHxLxS = positional.alibi_bias(q_pos, k_pos, positional.alibi_slopes(self.num_heads))
        if relative_table is not None:
            bias_BxHxLxS = positional.relative_bias(q_pos, k_pos, relative_table, bidirectional, self.max_distance)
        if causal and self.impl == "reference":  # the causal order on explicit positions, as part of the mask
            mask, causal = causal_mask(q_pos, k_pos) if mask is None else mask & causal_mask(q_pos, k_pos), False
        if not (is_global(window) or (causal and isinstance(window, int))):  # else by index in attend (the kernels')
            band = window_mask(q_pos, k_pos, window)  # on explicit positions, as the causal order above
            mask, window = band if mask is None else mask & band, 0
        out_BxLxHxK = self.attend(q_BxLxHxK, k, v, mask, causal, bias_BxHxLxS, deterministic, window)
        return self.project_out(out_BxLxHxK, x_BxLxD.shape[-1])

    def heads_in(self, name, heads, x_BxLxD):
        """x W [+ b]: W [D, heads, K] ~ N(0, init_std^2) -> [B, L, heads, K] (W_i^Q, W_i^K or W_i^V of each head)."""
        spec = ("embed", "heads" if name in ("query", "qkv") else "kv_heads", "kv")
        init = roles.init(nn.initializers.normal(self.init_std), spec, roles.QKV)
        w = self.param(name, init, (x_BxLxD.shape[-1], heads, self.head_dim))
        y = precision.einsum("bld,dhk->blhk", x_BxLxD.astype(self.dtype), w.astype(self.dtype))
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

    def score_options(self) -> dict:
        """The scores' scale (score_scale of scale_dim, else d_k) and soft cap, as `attend` takes them."""
        return dict(scale=score_scale(self.scale, self.scale_dim or self.head_dim), softcap=self.softcap)

    def attend(self, q_BxLxHxK, k, v, mask, causal, bias_BxHxLxS, deterministic, window=0):
        """The heads' attention (the module-level `attend`) with dropout on the weights and their sowing."""
        keep = None
        if self.dropout > 0 and not deterministic:  # one mask per head
            shape = (q_BxLxHxK.shape[0], self.num_heads, q_BxLxHxK.shape[1], k.shape[1])
            keep = jax.random.bernoulli(self.make_rng("dropout"), 1.0 - self.dropout, shape) / (1.0 - self.dropout)
        kwargs = dict(
            causal=causal, window=window, bias=bias_BxHxLxS, keep=keep, impl=self.impl, **self.score_options()
        )
        out_BxLxHxK, probs_BxHxLxS = attend(q_BxLxHxK, k, v, mask, **kwargs, weights=self.sow_weights)
        if self.sow_weights:
            self.sow("intermediates", "attention_weights", probs_BxHxLxS)
        return out_BxLxHxK

    def project_out(self, out_BxLxHxK, d_model):
        """Concat(head_1..head_h) W^O [+ b]: W^O [H, K, D] -> [B, L, D]."""
        spec, shape = ("heads", "kv", "embed"), (self.num_heads, self.head_dim, d_model)
        w_out = self.param("out", roles.init(nn.initializers.normal(self.out_init_std), spec, roles.OUT), shape)
        y_BxLxD = precision.einsum("blhk,hkd->bld", out_BxLxHxK.astype(self.dtype), w_out.astype(self.dtype))
        if not self.use_bias:
            return y_BxLxD
        zeros = roles.init(nn.initializers.zeros, ("embed",), roles.BIAS)
        return y_BxLxD + self.param("out_bias", zeros, (d_model,)).astype(self.dtype)
