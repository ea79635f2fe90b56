"""Positional information, each a function of explicit positions [batch, seq] (packed rows restart at 0; cached
decoding passes the absolute position of the new token).

- sinusoidal (Vaswani et al. 2017, sec. 3.5): PE(p, 2i) = sin(p / 10000^(2i/d)), PE(p, 2i+1) = cos(p / 10000^(2i/d))
- sinusoidal_halves (Marian, fairseq): the same sines and cosines, sines in the first d/2 channels and cosines in
  the last d/2 (Hugging Face's MarianSinusoidalPositionalEmbedding) instead of interleaved
- learned absolute: a trainable table [max_len, d] indexed by position (GPT-2); the module lives in models.py
- rotary (RoPE, Su et al. 2021): rotate each pair (x_2i, x_2i+1) of q and k by angle p * base^(-2i/d), so that
  q_m . k_n depends on m - n only
- ALiBi (Press et al. 2022): add -m_h * (i - j) to the scores of head h, slopes m_h = 2^(-8h/H)
- relative_buckets (T5, Raffel et al. 2020): add b_h(bucket(j - i)) to the scores of head h, one learned table
  [buckets, H] per stack shared by its layers; exact buckets for the short distances, logarithmic ones up to
  max_distance, both directions apart in an encoder, only the past in a causal decoder
- none: nothing (a causal LM can still infer position from the mask)
"""

import math

import jax.numpy as jnp

KINDS = ("none", "sinusoidal", "learned", "rope", "alibi", "sinusoidal_halves", "relative_buckets")


def sinusoidal(positions_BxL, d_model, base=10000.0):
    """[B, L] int -> [B, L, d_model] float32: sin on even channels, cos on odd ones."""
    inv_freq = base ** (-jnp.arange(0, d_model, 2, dtype=jnp.float32) / d_model)  # [d/2]
    angles = positions_BxL[..., None].astype(jnp.float32) * inv_freq  # [B, L, d/2]
    pe = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1)  # [B, L, d/2, 2]
    return pe.reshape(*positions_BxL.shape, -1)[..., :d_model]


def sinusoidal_halves(positions_BxL, d_model, base=10000.0):
    """[B, L] int -> [B, L, d_model] float32: sin(p / base^(2i/d)) in channel i and cos(p / base^(2i/d)) in channel
    d/2 + i, for i < d/2 (an odd d_model: ceil(d/2) sines, floor(d/2) cosines, as Marian's table)."""
    inv_freq = base ** (-jnp.arange(0, d_model, 2, dtype=jnp.float32) / d_model)  # [ceil(d/2)]
    angles = positions_BxL[..., None].astype(jnp.float32) * inv_freq  # [B, L, ceil(d/2)]
    return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)[..., : d_model // 2]], axis=-1)


def apply_rope(x_BxLxHxK, positions_BxL, base=10000.0):
    """Rotate channel pairs (2i, 2i+1) of x by positions * base^(-2i/K). x [B, L, H, K], K even."""
    k = x_BxLxHxK.shape[-1]
    inv_freq = base ** (-jnp.arange(0, k, 2, dtype=jnp.float32) / k)  # [K/2]
    angles = positions_BxL[:, :, None, None].astype(jnp.float32) * inv_freq  # [B, L, 1, K/2]
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    x = x_BxLxHxK.astype(jnp.float32).reshape(*x_BxLxHxK.shape[:-1], k // 2, 2)
    x_even, x_odd = x[..., 0], x[..., 1]
    rotated = jnp.stack([x_even * cos - x_odd * sin, x_even * sin + x_odd * cos], axis=-1)
    return rotated.reshape(x_BxLxHxK.shape).astype(x_BxLxHxK.dtype)


def alibi_slopes(num_heads):
    """m_h for h = 1..H: the geometric sequence 2^(-8h/H) (for a power-of-two H; otherwise the paper's
    interleaving of the next power of two's slopes)."""

    def pow2(n):
        return [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]

    p = 2 ** math.floor(math.log2(num_heads))
    slopes = pow2(p) + pow2(2 * p)[0::2][: num_heads - p]
    return jnp.asarray(slopes, jnp.float32)


def alibi_bias(q_pos_BxL, k_pos_BxS, slopes_H):
    """-m_h * |i - j|: the paper's -m_h * (i - j) for the keys a causal mask keeps, and its symmetric form for
    bidirectional attention. q_pos [B, L], k_pos [B, S] -> [B, H, L, S] float32."""
    dist = jnp.abs(q_pos_BxL[:, :, None] - k_pos_BxS[:, None, :]).astype(jnp.float32)  # [B, L, S]
    return -slopes_H[None, :, None, None] * dist[:, None]


def relative_bucket(relative_BxLxS, bidirectional, num_buckets=32, max_distance=128):
    """T5's bucket of each relative position j - i (HF's T5Attention._relative_position_bucket): bidirectional
    gives half the buckets to j > i; of the rest, the first half are the exact distances 0 .. n/2 - 1, the second
    half log-spaced distances up to max_distance (and beyond, in the last bucket)."""
    buckets = jnp.zeros_like(relative_BxLxS)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative_BxLxS > 0).astype(relative_BxLxS.dtype) * num_buckets
        distance = jnp.abs(relative_BxLxS)
    else:
        distance = -jnp.minimum(relative_BxLxS, 0)
    exact = num_buckets // 2
    log_ratio = jnp.log(jnp.maximum(distance, 1).astype(jnp.float32) / exact) / math.log(max_distance / exact)
    large = jnp.minimum(exact + (log_ratio * (num_buckets - exact)).astype(distance.dtype), num_buckets - 1)
    return buckets + jnp.where(distance < exact, distance, large)


def relative_bias(q_pos_BxL, k_pos_BxS, table_NxH, bidirectional, max_distance=128):
    """b_h(bucket(j - i)) from the learned table [num_buckets, H]: q_pos [B, L], k_pos [B, S] -> [B, H, L, S]."""
    relative_BxLxS = k_pos_BxS[:, None, :] - q_pos_BxL[:, :, None]
    buckets_BxLxS = relative_bucket(relative_BxLxS, bidirectional, table_NxH.shape[0], max_distance)
    return jnp.moveaxis(table_NxH[buckets_BxLxS], -1, 1).astype(jnp.float32)
