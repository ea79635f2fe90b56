"""Positional information, each a function of explicit positions [batch, seq] (packed rows restart at 0; cached
decoding passes the absolute position of the new token).

- sinusoidal (Vaswani et al. 2017, sec. 3.5): PE(p, 2i) = sin(p / 10000^(2i/d)), PE(p, 2i+1) = cos(p / 10000^(2i/d))
- sinusoidal_halves (Marian, fairseq): the same sines and cosines, sines in the first d/2 channels and cosines in
  the last d/2 (Hugging Face's MarianSinusoidalPositionalEmbedding) instead of interleaved
- learned absolute: a trainable table [max_len, d] indexed by position (GPT-2); the module lives in models.py
- rotary (RoPE, Su et al. 2021): rotate each pair (x_2i, x_2i+1) of q and k by angle p * base^(-2i/d), so that
  q_m . k_n depends on m - n only; `Rope` adds the frequency scalings for longer contexts as transformers defines
  them (modeling_rope_utils: linear, llama3, yarn with its attention factor) and partial rotary dimensions
- ALiBi (Press et al. 2022): add -m_h * (i - j) to the scores of head h, slopes m_h = 2^(-8h/H)
- relative_buckets (T5, Raffel et al. 2020): add b_h(bucket(j - i)) to the scores of head h, one learned table
  [buckets, H] per stack shared by its layers; exact buckets for the short distances, logarithmic ones up to
  max_distance, both directions apart in an encoder, only the past in a causal decoder
- none: nothing (a causal LM can still infer position from the mask)
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from txjax.model import masks

POSITIONAL_KINDS = ("none", "sinusoidal", "learned", "rope", "alibi", "sinusoidal_halves", "relative_buckets")
ROPE_SCALINGS = ("none", "linear", "llama3", "yarn")


@dataclasses.dataclass(frozen=True)
class Rope:
    """RoPE's frequencies theta_i = base^(-2i/d) over the first d = fraction * d_k channels of each head (the rest
    pass unrotated), rescaled for a longer context than `original_max_len` (transformers' ROPE_INIT_FUNCTIONS):
    - linear (position interpolation, Chen et al. 2023): theta_i / factor
    - llama3: wavelengths 2 pi / theta_i above original_max_len / low_freq_factor divided by factor, below
      original_max_len / high_freq_factor kept, between them interpolated by s = (original_max_len / wavelength -
      low) / (high - low): (1 - s) theta_i / factor + s theta_i
    - yarn (Peng et al. 2023, "YaRN"): theta_i / factor blended into theta_i by a linear ramp over the dimensions
      between those making beta_fast and beta_slow rotations in original_max_len, and cos/sin multiplied by the
      attention factor (default 0.1 ln(factor) + 1, eq. 21)."""

    base: float = 10000.0
    scaling: str = "none"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_len: int = 0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float = 0.0  # yarn: 0 = 0.1 ln(factor) + 1
    fraction: float = 1.0
    truncate: bool = True  # yarn: the ramp's ends rounded out to whole dimensions (transformers' truncate; GPT-OSS: no)

    def frequencies(self, head_dim: int):
        """theta [d/2] float32 for heads of head_dim channels (d = fraction * head_dim) and the factor that
        multiplies cos and sin. A scaled rope's are constants made on the host as transformers makes them in
        float32 (IEEE NumPy operations; the power by jax, which rounds it as torch does), so that its tables equal
        transformers' to float32 rounding: XLA's compiled divisions may differ in the last bit."""
        d = int(head_dim * self.fraction)
        if self.scaling == "none":  # today's expression, bit for bit
            return self.base ** (-jnp.arange(0, d, 2, dtype=jnp.float32) / d), 1.0
        with jax.ensure_compile_time_eval():
            scale = np.asarray(jnp.power(jnp.float32(self.base), np.arange(0, d, 2, dtype=np.float32) / np.float32(d)))
        theta = np.float32(1.0) / scale  # base^(2i/d) -> theta_i
        if self.scaling == "linear":
            return theta / np.float32(self.factor), 1.0
        if self.scaling == "llama3":
            wavelength = np.float32(2 * math.pi) / theta
            low, high = self.original_max_len / self.low_freq_factor, self.original_max_len / self.high_freq_factor
            scaled = np.where(wavelength > low, theta / np.float32(self.factor), theta)
            s = (np.float32(self.original_max_len) / wavelength - np.float32(self.low_freq_factor)) / np.float32(
                self.high_freq_factor - self.low_freq_factor
            )
            smoothed = (1 - s) * scaled / np.float32(self.factor) + s * scaled
            return np.where((wavelength >= high) & (wavelength <= low), smoothed, scaled).astype(np.float32), 1.0
        return self._yarn(scale, d)

    def softmax_multiplier(self, mscale_all_dim: float) -> float:
        """DeepSeek's YaRN factor on the scores' scale, mscale^2 with mscale = 0.1 m ln(factor) + 1 for m =
        mscale_all_dim (transformers' yarn_apply_mscale): 1 unless yarn stretches the context (factor > 1) and m > 0."""
        if self.scaling != "yarn" or self.factor <= 1 or not mscale_all_dim:
            return 1.0
        return (0.1 * mscale_all_dim * math.log(self.factor) + 1.0) ** 2

    def _yarn(self, scale, d: int):
        def dim_of(rotations):  # the dimension whose wavelength makes `rotations` turns in original_max_len
            return d * math.log(self.original_max_len / (rotations * 2 * math.pi)) / (2 * math.log(self.base))

        low, high = dim_of(self.beta_fast), dim_of(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, d - 1)
        ramp = (np.arange(d // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low if high > low else 0.001)
        extrapolate = 1 - np.clip(ramp, 0, 1)
        interpolated, extrapolated = np.float32(1.0) / (np.float32(self.factor) * scale), np.float32(1.0) / scale
        theta = interpolated * (1 - extrapolate) + extrapolated * extrapolate
        factor = self.attention_factor or (0.1 * math.log(self.factor) + 1.0 if self.factor > 1 else 1.0)
        return theta.astype(np.float32), factor


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


def layer_rope(rope: Rope, local_rope: Rope | None, window, head_dim: int):
    """A layer's (theta, factor): local_rope's where the layer is local (window > 0; a scanned layer's traced window
    selects between the two) and one is given, else rope's."""
    theta, factor = rope.frequencies(head_dim)
    if local_rope is None or masks.is_global(window):
        return theta, factor
    local = local_rope.frequencies(head_dim)
    if isinstance(window, int):
        return local
    return jnp.where(window > 0, local[0], theta), jnp.where(window > 0, local[1], factor)


def rope_tables(positions_BxL, theta, factor=1.0):
    """cos and sin of positions * theta, times `factor` (yarn's): [B, L, 1, d/2] float32 each."""
    angles = positions_BxL[:, :, None, None].astype(jnp.float32) * theta  # [B, L, 1, d/2]
    return jnp.cos(angles) * factor, jnp.sin(angles) * factor


def apply_rope(x_BxLxHxK, positions_BxL, rope=10000.0):
    """Rotate channel pairs (2i, 2i+1) of x by positions * theta_i: `rope` a base (theta_i = base^(-2i/K)) or a Rope
    (its scaled frequencies over its first d channels, the rest as they are). x [B, L, H, K], d even."""
    theta, factor = (rope if isinstance(rope, Rope) else Rope(rope)).frequencies(x_BxLxHxK.shape[-1])
    return rotate(x_BxLxHxK, *rope_tables(positions_BxL, theta, factor))


def rotate(x_BxLxHxK, cos, sin):
    """x's first 2 * cos.shape[-1] channels rotated pair by pair, (x_2i, x_2i+1) by the angle whose cos and sin are
    given ([B, L, 1, d/2]), the rest unrotated."""
    d = 2 * cos.shape[-1]
    x = x_BxLxHxK[..., :d].astype(jnp.float32).reshape(*x_BxLxHxK.shape[:-1], d // 2, 2)
    x_even, x_odd = x[..., 0], x[..., 1]
    rotated = jnp.stack([x_even * cos - x_odd * sin, x_even * sin + x_odd * cos], axis=-1)
    rotated = rotated.reshape(*x_BxLxHxK.shape[:-1], d).astype(x_BxLxHxK.dtype)
    return rotated if d == x_BxLxHxK.shape[-1] else jnp.concatenate([rotated, x_BxLxHxK[..., d:]], axis=-1)


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


def temperature(q_pos, scale: float, floor_scale: int):
    """Llama 4's attention temperature of its NoPE layers (attn_temperature_tuning): each query times
    1 + scale * log(1 + floor((p + 1) / floor_scale)) at its position p, so that the scores of a layer without
    positions stay sharp as the context grows past floor_scale. q_pos [B, L] -> float32 [B, L, 1, 1]."""
    steps = jnp.floor((q_pos.astype(jnp.float32) + 1.0) / floor_scale)
    return (1.0 + scale * jnp.log1p(steps))[..., None, None]
