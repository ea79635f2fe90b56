"""Attention: the equation, its masks, and the multi-head module.

    Attention(Q, K, V) = softmax(mask(Q K^T * scale)) V,     scale = 1/sqrt(d_k)   (Vaswani et al. 2017, eq. 1)
    MultiHead(Q, K, V) = Concat(head_1..head_h) W^O,  head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

`scaled_dot_product_attention` is one head; `MultiHeadAttention` projects with per-head weights written as einsums
and `vmap`s that one-head function over the heads. The same module serves self-attention (kv = x), masked
self-attention (a causal mask) and cross-attention (kv = encoder output, padding mask only). Masks are boolean with
True meaning "may attend".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import einops
import flax.linen as nn
import jax
import jax.numpy as jnp

from txjax import blockwise, positional, precision

NEG_INF = -1e30  # "a large negative number": exp() underflows to exactly 0 in float32, no inf - inf = NaN
ATTENTION_IMPLS = ("auto", "reference", "fused", "cudnn", "blockwise")  # auto: resolve_impl picks one of the rest


# ----------------------------------------------------------------------------------------------------------------
# The equation


def scaled_dot_product_attention(q, k, v, mask=None, *, bias=None, scale=None, keep=None, return_weights=False):
    """softmax(mask(q k^T * scale + bias)) v for one head.

    q: [..., n_q, d_k], k: [..., n_k, d_k], v: [..., n_k, d_v]; mask: bool broadcastable to [..., n_q, n_k]
    (True = may attend); bias: float broadcastable to [..., n_q, n_k] (ALiBi). scale defaults to 1/sqrt(d_k).
    keep: dropout on the attention weights, multipliers (0 or 1/(1-p)) broadcastable to [..., n_q, n_k].
    The softmax runs in float32 whatever the input dtype; a row whose keys are all masked returns zeros.
    Returns [..., n_q, d_v]; with return_weights also the weights softmax(...) [..., n_q, n_k] (before dropout).
    """
    probs = attention_weights(q, k, mask, bias=bias, scale=scale)
    out = attention_output(probs if keep is None else probs * keep, v)
    return (out, probs) if return_weights else out


def attention_weights(q, k, mask=None, *, bias=None, scale=None):
    """The probabilities softmax(mask(q k^T * scale + bias)) over keys: [..., n_q, n_k], float32."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = precision.einsum("...qd,...kd->...qk", q, k, out_dtype=jnp.float32) * scale
    if bias is not None:
        scores = scores + bias
    if mask is None:
        return jax.nn.softmax(scores, axis=-1)
    scores = jnp.where(mask, scores, NEG_INF)
    probs = jax.nn.softmax(scores, axis=-1)
    return jnp.where(mask.any(axis=-1, keepdims=True), probs, 0.0)  # fully masked row -> zeros, not uniform


def attention_output(probs, v):
    """probs @ v: [..., n_q, n_k] x [..., n_k, d_v] -> [..., n_q, d_v] in v's dtype (float32 sums)."""
    return precision.einsum("...qk,...kd->...qd", probs.astype(v.dtype), v)


# ----------------------------------------------------------------------------------------------------------------
# Masks: boolean [batch, 1, n_q, n_k] (the 1 broadcasts over heads); True = may attend.


def causal_mask(q_pos, k_pos):
    """j <= i on explicit positions: q_pos [B, Lq], k_pos [B, Lk] -> [B, 1, Lq, Lk]."""
    return k_pos[:, None, None, :] <= q_pos[:, None, :, None]


def padding_mask(q_valid, k_valid):
    """Both query and key are real tokens: q_valid [B, Lq], k_valid [B, Lk] bool -> [B, 1, Lq, Lk]."""
    return q_valid[:, None, :, None] & k_valid[:, None, None, :]


def segment_mask(q_seg, k_seg):
    """Packed rows: attend only inside your own segment, never to padding (segment 0).

    q_seg [B, Lq], k_seg [B, Lk] int -> [B, 1, Lq, Lk].
    """
    same = q_seg[:, None, :, None] == k_seg[:, None, None, :]
    return same & padding_mask(q_seg > 0, k_seg > 0)


def resolve_impl(impl: str, dtype, head_dim: int) -> str:
    """The attention implementation that runs for ModelConfig.attention_impl: 'auto' is cuDNN's fused (flash)
    kernel on an NVIDIA GPU where it serves the case (16-bit q/k/v, d_k a multiple of 8 up to 128), else the
    reference einsums; 'reference', 'fused' (jax.nn.dot_product_attention's XLA formulation) and 'cudnn' as named."""
    if impl == "cudnn" and not cuda_available():
        raise ValueError(f"model.attention_impl='cudnn' needs an NVIDIA GPU (here: {jax.default_backend()}); use auto")
    if impl != "auto":
        return impl
    fits = jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16) and head_dim % 8 == 0 and head_dim <= 128
    return "cudnn" if fits and cuda_available() else "reference"


def cuda_available() -> bool:
    """Whether jax's default backend is an NVIDIA GPU (cuDNN's attention needs CUDA; a ROCm GPU is 'gpu' too)."""
    return jax.default_backend() == "gpu" and "cuda" in jax.devices()[0].client.platform_version.lower()


# ----------------------------------------------------------------------------------------------------------------
# Multi-head attention


def _per_head(fn: Callable) -> Callable:
    """vmap a one-head function over the heads: q [B, L, H, K] with k/v [B, S, KV, K], or with decoding's keys
    [B*KV, K, S] and values [B*KV, S, K] (see `cache_layout`) -> out [B, L, H, K], probs [B, H, L, S].

    With grouped-query attention (H = KV * R) it vmaps over the K/V heads and then over the R query heads that share
    one K/V head (k and v broadcast), so K/V are never copied. fn(q [..., L, K], k [..., S, K], v [..., S, K],
    mask [..., L, S] | None, bias | None, keep | None) -> (out [..., L, K], probs [..., L, S]), where `...` is the
    rows [B] for k/v [B, S, KV, K] (the mask [B|1, L, S] shared by the heads) and nothing for decoding's layout (one
    vmap over the rows and K/V heads together, the mask repeated per K/V head); per-head extras (bias, keep) come as
    [B|1, H, L, S].
    """
    over_r = jax.vmap(fn, in_axes=(-2, None, None, None, -3, -3), out_axes=(-2, -3))

    def run(q_BxLxHxK, k, v, mask, bias, keep):
        b = q_BxLxHxK.shape[0]
        if k.ndim == 4:  # [B, S, KV, K]
            g = k.shape[-2]
            split = lambda t: None if t is None else einops.rearrange(t, "b (g r) l s -> b g r l s", g=g)
            q_BxLxGxRxK = einops.rearrange(q_BxLxHxK, "b l (g r) k -> b l g r k", g=g)
            over_kv = jax.vmap(over_r, in_axes=(-3, -2, -2, None, 1, 1), out_axes=(-3, 1))
            out, probs = over_kv(q_BxLxGxRxK, k, v, mask, split(bias), split(keep))
            out = einops.rearrange(out, "b l g r k -> b l (g r) k")
            return out, einops.rearrange(probs, "b g r l s -> b (g r) l s")
        g = k.shape[0] // b  # keys [B*KV, K, S], values [B*KV, S, K]
        k = k.swapaxes(-1, -2)  # fn's [S, K] view; XLA folds the swap into the score product, which reads [K, S]
        rows = lambda t: None if t is None else jnp.broadcast_to(t, (b, *t.shape[1:]))  # [1, ...]: shared by rows
        split = lambda t: None if t is None else einops.rearrange(rows(t), "b (g r) l s -> (b g) r l s", g=g)
        q_BGxLxRxK = einops.rearrange(q_BxLxHxK, "b l (g r) k -> (b g) l r k", g=g)
        mask = None if mask is None else einops.repeat(rows(mask), "b l s -> (b g) l s", g=g)
        out, probs = jax.vmap(over_r)(q_BGxLxRxK, k, v, mask, split(bias), split(keep))
        out = einops.rearrange(out, "(b g) l r k -> b l (g r) k", b=b)
        return out, einops.rearrange(probs, "(b g) r l s -> b (g r) l s", b=b)

    return run


def write_slots(cache, new, i, axis: int):
    """The cache with `new` written at slots i.. of `axis` (dynamic_update_slice, in place in a decode loop).

    One slot of a 16-bit cache on XLA:CPU is written as a select over the whole cache instead, where(slot == i, new,
    cache): XLA:CPU's in-place update of 16-bit values is the slower of the two, while float32's is the faster
    (benchmarks/cache_update.py measures both)."""
    if new.shape[axis] == 1 and cache.dtype.itemsize == 2 and jax.default_backend() == "cpu":
        return jnp.where(jax.lax.broadcasted_iota(jnp.int32, cache.shape, axis) == i, new, cache)
    return jax.lax.dynamic_update_slice(cache, new, tuple(i if a == axis else 0 for a in range(cache.ndim)))


def cache_layout(k_BxSxGxK, v_BxSxGxK):
    """Keys and values [B, S, KV, K] -> decoding's layout: keys [B*KV, K, S], values [B*KV, S, K] (rows and K/V
    heads on one leading axis; keys transposed).

    Why one leading axis: XLA:CPU multiplies batched matrices in place only when their batch axes lead in memory
    in the product's order and are not of size 1. Vmapped over the heads of [B, S, KV, K] the products' batch axes
    are (KV head, row), so every decode step copied each layer's whole cache into that order; stored
    [B, KV, S, K] the two batch axes match, but at B = 1 XLA drops the size-1 axis and duplicates the cache update
    (a copy again). One merged axis is read as it lies at every B. Why keys transposed: the scores q k^T contract
    d_k, and XLA:CPU's batched product q [R, K] x k^T streams k [K, S] (a plain matrix product) about twice as
    fast as k [S, K] contracted on its minor axis (benchmarks/decode_profile.py shows the score products); the
    values' product p [R, S] x v [S, K] already has that form. Training keeps [B, S, KV, K]: there the mask,
    repeated per K/V head by this layout, would cost more than the transpose it saves.
    """
    return einops.rearrange(k_BxSxGxK, "b s g k -> (b g) k s"), einops.rearrange(v_BxSxGxK, "b s g k -> (b g) s k")


def out_major_product(x_BxLxI, w_Oxi):
    """x W^T with W stored output axes first, [O..., I...] (the decoding layout for one row): x's trailing axes
    (I...) against W's as one [(O...), (I...)] matrix, the result's last axis split back into O... .

    Why the flattening: XLA:CPU multiplies a vector by an [out, in] matrix reading each output's weights as one
    contiguous row, faster than by [in, out]; but a kernel with two output or input axes it first transposes into
    [in, out], a copy of the whole matrix at every call. Why one row only: from 2 rows on, XLA:CPU's matrix product
    x [B, in] W [in, out] is the faster one (benchmarks/decode_profile.py --batch=32 lists the weight products'
    ms per step by einsum, bli,io->blo for this orientation)."""
    out_axes = w_Oxi.shape[: w_Oxi.ndim - (x_BxLxI.ndim - 2)]
    w_2d = w_Oxi.reshape(math.prod(out_axes), -1)
    y = precision.einsum("bli,oi->blo", x_BxLxI.reshape(*x_BxLxI.shape[:2], -1), w_2d)
    return y.reshape(*y.shape[:2], *out_axes)


class MultiHeadAttention(nn.Module):
    """Multi-head attention with h heads and 3h+1 weight matrices (W_i^Q, W_i^K, W_i^V per head, one W^O).

    Weights: query [d_model, heads, d_k], key/value [d_model, kv_heads, d_k], out [heads, d_k, d_model] (with
    out_major output axes first); none has a sequence axis. `kv=None` means self-attention. In decode mode
    the keys/values of the new tokens are written into a preallocated cache at `cache_index` and the queries attend
    over the whole cache; in decode mode keys and values are in `cache_layout`, [B*KV, K, S] and [B*KV, S, K].
    """

    num_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: jnp.dtype = jnp.float32
    use_bias: bool = False
    qkv_bias: bool = False  # biases on query/key/value only (Qwen2); use_bias puts them on all four
    dropout: float = 0.0
    scale: str = "sqrt"  # 'sqrt' (1/sqrt(d_k)) | 'none' | 'linear' (1/d_k): the scaling ablation
    impl: str = "reference"  # 'reference' (einsum + vmap) | 'fused' | 'cudnn' (jax.nn.dot_product_attention's)
    # | 'blockwise' (txjax.blockwise, in blocks of block_sizes = (queries, keys); given the mask as Segments)
    block_sizes: tuple[int, int] = (256, 256)
    rope_base: float | None = None  # rotate q and k (RoPE) when set
    alibi: bool = False
    qk_norm: bool = False  # RMSNorm of q and k over each head's d_k before the scores (Dehghani et al. 2023)
    decoding_layout: bool = False  # txjax.decode.for_decoding's: self-attention's W^Q|W^K|W^V one 'qkv'
    out_major: bool = False  # every weight stored output axes first (query/key/value/qkv [heads, d_k, d_model], out
    # [d_model, heads, d_k]), so that a batch-1 product reads each output's weights as one contiguous row
    # (out_major_product says why); for_decoding sets it when it decodes one row at a time
    norm_eps: float = 1e-5
    sow_weights: bool = False
    cross: bool = False  # keys/values from another sequence (the encoder output)
    init_std: float = 0.02  # W^Q, W^K, W^V ~ N(0, init_std^2)
    out_init_std: float = 0.02  # W^O (GPT-2 scales it by 1/sqrt(2 * layers))

    @nn.compact
    def __call__(self, x_BxLxD, mask, *, q_pos, kv=None, k_pos=None, causal=False, deterministic=True, decode=False):
        """x [B, Lq, D] queries; kv [B, Lk, D] the keys' sequence for cross-attention (self-attention: x; in decode
        mode None reuses the encoder keys/values cached by the first call); mask bool [B, 1, Lq, Lk] or None, or
        blockwise.Segments (the segment ids, which blockwise attention reads block by block);
        q_pos [B, Lq], k_pos [B, Lk] explicit positions (RoPE, ALiBi). causal: also causal_mask(q_pos, k_pos),
        which a fused kernel applies as is_causal (positions must grow along the sequence within a segment, as
        txjax's inputs do, so that it equals the index order the kernel uses). Returns [B, Lq, D]."""
        d_model = x_BxLxD.shape[-1]
        use_dropout = self.dropout > 0 and not deterministic
        blockwise_here = self.impl == "blockwise" and not (decode or self.sow_weights or use_dropout)
        if isinstance(mask, blockwise.Segments) and not blockwise_here:  # the other paths read the dense mask
            mask = segment_mask(*mask)
        blockwise_here = blockwise_here and (mask is None or isinstance(mask, blockwise.Segments))
        kv = kv if self.cross else x_BxLxD
        k_pos = q_pos if k_pos is None else k_pos
        init = nn.initializers.normal(stddev=self.init_std)

        def proj(name, heads, inp, spec):
            shape, product = (d_model, heads, self.head_dim), partial(precision.einsum, "bld,dhk->blhk")
            if self.out_major:  # w [H, K, D], read as one [(H K), D] matrix
                shape, spec, product = shape[1:] + shape[:1], spec[1:] + spec[:1], out_major_product
            w = self.param(name, nn.with_logical_partitioning(init, spec), shape)
            out = product(inp.astype(self.dtype), w.astype(self.dtype))
            if self.use_bias or self.qkv_bias:
                out = out + self.param(
                    f"{name}_bias",
                    nn.with_logical_partitioning(nn.initializers.zeros, spec[1:]),
                    (heads, self.head_dim),
                ).astype(self.dtype)
            return out

        def rms_norm(name, t):  # QK-norm: g * t / sqrt(mean_k(t^2) + eps) over each head's d_k, in float32
            if not self.qk_norm:
                return t
            scale_init = nn.with_logical_partitioning(nn.initializers.ones, ("kv",))
            return nn.RMSNorm(self.norm_eps, jnp.float32, scale_init=scale_init, name=name)(t).astype(t.dtype)

        h, g = self.num_heads, self.num_kv_heads
        # k, v: [B, S, KV, K] from the projections; in decode mode [B*KV, K, S], [B*KV, S, K] (cache_layout) once cached
        if self.decoding_layout and not self.cross:  # decoding's layout: one product x [W^Q|W^K|W^V] instead of three
            qkv = jnp.split(proj("qkv", h + 2 * g, x_BxLxD, ("embed", "heads", "kv")), (h, h + g), axis=2)
            q_BxLxHxK, k, v = rms_norm("query_norm", qkv[0]), rms_norm("key_norm", qkv[1]), qkv[2]
        else:
            q_BxLxHxK = rms_norm("query_norm", proj("query", h, x_BxLxD, ("embed", "heads", "kv")))
            if kv is None:  # cross-attention decode step: K/V of the encoder output, computed once at prefill
                k = self.get_variable("cache", "cross_key")
                v = self.get_variable("cache", "cross_value")
            else:
                k = rms_norm("key_norm", proj("key", g, kv, ("embed", "kv_heads", "kv")))
                v = proj("value", g, kv, ("embed", "kv_heads", "kv"))
                if decode and self.cross:
                    k, v = cache_layout(k, v)
                    self.put_variable("cache", "cross_key", k)
                    self.put_variable("cache", "cross_value", v)
        if self.rope_base is not None:
            q_BxLxHxK = positional.apply_rope(q_BxLxHxK, q_pos, self.rope_base)
            k = positional.apply_rope(k, k_pos, self.rope_base)
        if decode and not self.cross:  # the cache's mask holds the causal order of its slots
            k, v, k_pos, mask = self._update_cache(*cache_layout(k, v), q_pos, mask)
            causal = False

        bias_BxHxLxS = None
        if self.alibi and not blockwise_here:
            bias_BxHxLxS = positional.alibi_bias(q_pos, k_pos, positional.alibi_slopes(self.num_heads))
        scale = {"sqrt": self.head_dim**-0.5, "none": 1.0, "linear": 1.0 / self.head_dim}[self.scale]
        # cuDNN's kernel serves training and whole-sequence passes; a decode step's few queries read the cache
        # with the reference einsums (no L x S score matrix to avoid there)
        fused = (self.impl == "fused" or self.impl == "cudnn" and not decode) and not (self.sow_weights or use_dropout)
        if causal and not (fused or blockwise_here):  # the reference applies the causal order as part of the mask
            mask, causal = causal_mask(q_pos, k_pos) if mask is None else mask & causal_mask(q_pos, k_pos), False
        if blockwise_here:  # masks and ALiBi's bias made block by block: no L x S array
            slopes_H = positional.alibi_slopes(self.num_heads) if self.alibi else None
            out_BxLxHxK = blockwise.attention(
                q_BxLxHxK,
                k,
                v,
                mask,
                q_pos,
                k_pos,
                causal=causal,
                slopes_H=slopes_H,
                scale=scale,
                block_q=self.block_sizes[0],
                block_kv=self.block_sizes[1],
            )
        else:
            out_BxLxHxK = self._attend(q_BxLxHxK, k, v, mask, causal, bias_BxHxLxS, scale, use_dropout, fused)

        spec, shape = ("heads", "kv", "embed"), (self.num_heads, self.head_dim, d_model)
        product = partial(precision.einsum, "blhk,hkd->bld")
        if self.out_major:  # w_out [D, H, K], read as one [D, (H K)] matrix
            spec, shape, product = spec[-1:] + spec[:-1], shape[-1:] + shape[:-1], out_major_product
        w_out = self.param("out", nn.with_logical_partitioning(nn.initializers.normal(self.out_init_std), spec), shape)
        y_BxLxD = product(out_BxLxHxK.astype(self.dtype), w_out.astype(self.dtype))
        if self.use_bias:
            y_BxLxD = y_BxLxD + self.param(
                "out_bias", nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)), (d_model,)
            ).astype(self.dtype)
        return y_BxLxD

    def _attend(self, q, k, v, mask, causal, bias, scale, use_dropout, fused):
        """Per-head softmax(mask(qk^T*scale+bias))v: q [B,L,H,K], k/v [B,S,KV,K] or [B*KV,S,K] -> [B,L,H,K];
        fused: jax.nn.dot_product_attention (self.impl's XLA or cuDNN kernel), with `causal` as its is_causal."""
        if fused:
            if k.ndim == 3:  # decoding's cache_layout -> dot_product_attention's [B, S, KV, K]
                k = einops.rearrange(k, "(b g) k s -> b s g k", b=q.shape[0])
                v = einops.rearrange(v, "(b g) s k -> b s g k", b=q.shape[0])
            b, l, s = q.shape[0], q.shape[1], k.shape[1]
            if mask is not None:
                mask = jnp.broadcast_to(mask, (b, 1, l, s))
            implementation = "cudnn" if self.impl == "cudnn" else "xla"
            out = jax.nn.dot_product_attention(
                q, k, v, bias=bias, mask=mask, scale=scale, is_causal=causal, implementation=implementation
            )
            if mask is None:
                return out
            # like the reference: a query with no key to attend to (padding) gets zeros
            attended = mask & jnp.tri(l, s, dtype=bool) if causal else mask
            return out * attended.any(-1)[:, 0, :, None, None].astype(out.dtype)
        gqa_bf16_cpu = self.num_kv_heads < self.num_heads and q.dtype == jnp.bfloat16 and jax.default_backend() == "cpu"
        if gqa_bf16_cpu and k.ndim == 4:
            # XLA:CPU runs bfloat16 dots only through XNNPACK, which takes at most two batch axes; the backward of
            # grouped-query attention over [B, S, KV, K] has three (batch, K/V head, query head of the group):
            # float32 here instead. Decoding's cache_layout has two (rows and K/V heads as one, the query head),
            # and casting there would convert the whole cache at every step.
            q, k, v = (t.astype(jnp.float32) for t in (q, k, v))
        keep = None
        if use_dropout:  # dropout on the attention weights, one mask per head
            shape = (q.shape[0], self.num_heads, q.shape[1], k.shape[1])
            keep = jax.random.bernoulli(self.make_rng("dropout"), 1.0 - self.dropout, shape) / (1.0 - self.dropout)
        m = None if mask is None else mask[:, 0]  # [B|1, Lq, Lk], shared by all heads

        def one_head(q_, k_, v_, m_, bias_, keep_):
            return scaled_dot_product_attention(
                q_, k_, v_, m_, bias=bias_, scale=scale, keep=keep_, return_weights=True
            )

        out_BxLxHxK, probs_BxHxLxS = _per_head(one_head)(q, k, v, m, bias, keep)
        if self.sow_weights:
            self.sow("intermediates", "attention_weights", probs_BxHxLxS)
        return out_BxLxHxK

    def _update_cache(self, k_new, v_new, q_pos, mask):
        """Write this call's keys/values at cache_index; return the whole cache and its mask.

        k_new [B*KV, K, L], v_new [B*KV, L, K] and the cache ([B*KV, K, max_len], [B*KV, max_len, K]) are in
        `cache_layout`; `cached_pos` [B, max_len]
        stores each slot's position (-1 = empty). A query attends to a filled slot whose position is <= its own and
        that `mask` (the new tokens' mask, [B,1,L,L], for left padding) does not exclude.
        """
        b, l = q_pos.shape
        is_init = not self.has_variable("cache", "cached_key")
        ck = self.variable("cache", "cached_key", jnp.zeros, k_new.shape, k_new.dtype)
        cv = self.variable("cache", "cached_value", jnp.zeros, v_new.shape, v_new.dtype)
        cpos = self.variable("cache", "cached_pos", lambda: jnp.full((b, l), -1, jnp.int32))
        cidx = self.variable("cache", "cache_index", lambda: jnp.zeros((), jnp.int32))
        if is_init:  # model.init(decode=True) on a [B, max_len] dummy only allocates the cache
            return k_new, v_new, q_pos, mask
        i = cidx.value
        ck.value, cv.value = write_slots(ck.value, k_new, i, axis=2), write_slots(cv.value, v_new, i, axis=1)
        # a new token excluded by the caller's mask from its own slot (left padding) is stored as empty (-1)
        own = jnp.ones((b, l), bool) if mask is None else jnp.diagonal(mask[:, 0], axis1=1, axis2=2)
        cpos.value = jax.lax.dynamic_update_slice(cpos.value, jnp.where(own, q_pos, -1).astype(jnp.int32), (0, i))
        cidx.value = i + l
        k_pos = cpos.value
        full_mask = (k_pos[:, None, None, :] >= 0) & causal_mask(q_pos, k_pos)
        return ck.value, cv.value, k_pos, full_mask
