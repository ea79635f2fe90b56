"""Gated DeltaNet (Yang, Kautz & Hatamizadeh 2025; Qwen3-Next's and Kimi Linear's linear-attention layers): a token
mixer whose memory is one d_k x d_v matrix per head, whatever the context.

    S_t = alpha_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T,        o_t = S_t q_t

stored transposed, [d_k, d_v] per value head, as transformers' Qwen3NextGatedDeltaNet and FLA store it (o_t = q_t^T
S_t). q_t, k_t are L2-normalized per head and q_t scaled by 1/sqrt(d_k); alpha_t = exp(g_t) with the log decay
g_t = -exp(A_log) softplus(a_t + dt_bias), beta_t = sigmoid(b_t), one of each per value head; a query/key head
serves v_heads / heads consecutive value heads. Before the rule, a causal depthwise convolution of `conv` taps over
q, k, v's channels, then SiLU; after it a gated RMSNorm per head, RMSNorm(o) * w * silu(z), and W^O.

`chunked_delta_rule` computes it C tokens at a time (transformers' torch_chunk_gated_delta_rule; Yang et al. 2024's
WY/UT form): within a chunk the delta rule's corrections are one unit lower-triangular inverse, across chunks a scan
carries S, the cumulative decay in float32. Memory grows as L x C, not L^2. A call of L < C tokens is one chunk of L,
so a decode step (L = 1) is the recurrence itself, one token at a time, from the state in the cache
(kv_cache.linear_state_cache).

Packed documents: each token belongs to a run, the tokens since its segment began; the convolution and the rule read
only their own run's tokens (and the state passed in continues the call's first run), so a document never sees
another's. Padding (segment 0) writes nothing: zero inputs, beta 0 and no decay.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from txjax.model import precision, roles
from txjax.model.blockwise import Segments
from txjax.model.config import ModelConfig
from txjax.model.kv_cache import linear_state_cache
from txjax.model.linear_config import linear_sizes


def l2_normalize(x, eps: float = 1e-6):
    """x / sqrt(sum x^2 + eps) over the last axis (FLA's l2norm, as transformers computes it)."""
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def runs_of(segments_BxL):
    """Each token's run [B, L]: 0 until the call's segment first changes, then one more at each change, so that two
    tokens of a run are of one document with no start between them (0 also continues the cached state)."""
    starts = segments_BxL[:, 1:] != segments_BxL[:, :-1]
    return jnp.concatenate([jnp.zeros_like(segments_BxL[:, :1]), jnp.cumsum(starts, axis=1)], axis=1)


def causal_conv(x_BxLxC, kernel_WxC, history_BxTxC, runs_BxL):
    """y_t = silu(sum_j w_j x_{t-W+1+j}) over the inputs of t's own run, T = W - 1 inputs of history before the call
    (run 0) -> (y [B, L, C], the last T inputs of the last token's run, zeros elsewhere: the next call's history)."""
    w, (b, l) = kernel_WxC.shape[0], x_BxLxC.shape[:2]
    xs = jnp.concatenate([history_BxTxC.astype(x_BxLxC.dtype), x_BxLxC], axis=1)
    rs = jnp.concatenate([jnp.zeros((b, w - 1), runs_BxL.dtype), runs_BxL], axis=1)
    taps = [kernel_WxC[j] * xs[:, j : j + l] * (rs[:, j : j + l] == runs_BxL)[..., None] for j in range(w)]
    kept = xs[:, xs.shape[1] - (w - 1) :] * (rs[:, rs.shape[1] - (w - 1) :] == runs_BxL[:, -1:])[..., None]
    return jax.nn.silu(sum(taps)), kept


def unit_lower_inverse(a):
    """(I + a)^-1 of strictly lower-triangular a [..., C, C], by doubling: the inverse's diagonal blocks of size s
    give those of size 2s, [[X, 0], [Y, Z]]^-1 = [[X^-1, 0], [-Z^-1 Y X^-1, Z^-1]] (log2 C levels of batched
    matmuls, padded to a power of two; no LAPACK call, so XLA runs it as it runs the rest, on any backend)."""
    c = a.shape[-1]
    size = 1 << (c - 1).bit_length()
    a = jnp.pad(a, [(0, 0)] * (a.ndim - 2) + [(0, size - c)] * 2)
    inv, s = jnp.ones((*a.shape[:-2], size, 1, 1), a.dtype), 1  # the 1 x 1 diagonal blocks
    while s < size:
        n = size // (2 * s)
        low = jnp.einsum("...aiaj->...aij", a.reshape(*a.shape[:-2], n, 2 * s, n, 2 * s))[..., s:, :s]
        x, z = inv[..., 0::2, :, :], inv[..., 1::2, :, :]
        y = -jnp.einsum("...ij,...jk,...kl->...il", z, low, x)
        inv = jnp.concatenate([jnp.concatenate([x, jnp.zeros_like(x)], -1), jnp.concatenate([y, z], -1)], -2)
        s *= 2
    return inv[..., 0, :c, :c]


def chunked_delta_rule(q, k, v, g, beta, runs, state, chunk: int):
    """The gated delta rule over L tokens in chunks of C = min(chunk, L) (the last padded with tokens that change
    nothing: k = 0, beta = 0, g = 0), all in float32.

    q, k [B, L, H, K] (L2-normalized, q scaled; one per value head), v [B, L, H, V], g (log decay) and beta
    [B, L, H], runs [B, L] (runs_of), state [B, H, K, V] (the state before the first token) -> (o [B, L, H, V], the
    state after the last token). With G the decay's cumulative sum in a chunk and D_ij = exp(G_i - G_j) for j <= i
    of i's run (else 0; the exponent summed from g_{j+1} to g_i), the chunk's corrections u = (I + A)^-1 (beta v -
    beta exp(G) k S), A_ij = beta_i D_ij k_i.k_j (j < i); o_i = exp(G_i) q_i S + sum_j D_ij (q_i.k_j) u_j; S' =
    exp(G_C) S + sum_j D_Cj k_j u_j^T, the terms of S kept only for tokens of the run the state continues."""
    f32 = lambda t: t.astype(jnp.float32)
    q, k, v, g, beta = map(f32, (q, k, v, g, beta))
    b, l, h, _ = k.shape
    c = min(chunk, l)
    pad, n = -l % c, -(-l // c)

    def chunks(t, mode="constant"):  # [B, L, H, ...] -> [B, H, N, C, ...]; runs [B, L] -> [B, 1, N, C]
        t = t[:, :, None] if t.ndim == 2 else t
        t = jnp.pad(t, [(0, 0), (0, pad)] + [(0, 0)] * (t.ndim - 2), mode=mode)
        return jnp.moveaxis(t.reshape(b, n, c, *t.shape[2:]), (1, 2), (2, 3))

    q, k, v = (chunks(t) for t in (q, k, v))  # [B, H, N, C, K|V]
    g, beta, runs = chunks(g), chunks(beta), chunks(runs, "edge")  # [B, H|1, N, C]
    before = jnp.concatenate([jnp.zeros_like(runs[:, :, :1, :1]), runs[:, :, :-1, -1:]], axis=2)  # [B, 1, N, 1]
    carried = runs == before  # the state passed into the chunk reaches these tokens
    same = (runs[..., :, None] == runs[..., None, :]) & jnp.tril(jnp.ones((c, c), bool))
    G = jnp.cumsum(g, axis=-1)
    # G_i - G_j summed as g_{j+1} + ... + g_i, not subtracted: two cumulative sums of order -50 cancel to an error of
    # ~5e-6 in D, 10x the rule's other float32 rounding (and Qwen3-Next's logits 2e-4 from transformers' float64)
    between = jnp.cumsum(jnp.where(jnp.tril(jnp.ones((c, c), bool), -1), g[..., :, None], 0.0), axis=-2)
    D = jnp.where(same, jnp.exp(between), 0.0)  # [B, H, N, C, C]
    k_beta = k * beta[..., None]
    A = jnp.einsum("...ik,...jk->...ij", k_beta, k) * D * jnp.tril(jnp.ones((c, c)), -1)
    decay = jnp.exp(G) * carried
    T = unit_lower_inverse(A)
    u_v, u_k = (T @ t for t in (v * beta[..., None], k_beta * decay[..., None]))  # u = u_v - u_k S
    qk = jnp.einsum("...ik,...jk->...ij", q, k) * D
    q_decayed, k_last = q * decay[..., None], k * D[..., -1, :, None]

    def step(s_BxHxKxV, chunk_n):
        u_v, u_k, qk, q_decayed, k_last, decay_last = chunk_n
        u = u_v - jnp.einsum("bhck,bhkv->bhcv", u_k, s_BxHxKxV)
        o = jnp.einsum("bhck,bhkv->bhcv", q_decayed, s_BxHxKxV) + jnp.einsum("bhij,bhjv->bhiv", qk, u)
        s_BxHxKxV = decay_last[..., None, None] * s_BxHxKxV + jnp.einsum("bhck,bhcv->bhkv", k_last, u)
        return s_BxHxKxV, o

    by_chunk = lambda t: jnp.moveaxis(t, 2, 0)
    inputs = tuple(map(by_chunk, (u_v, u_k, qk, q_decayed, k_last, decay[..., -1])))
    state, o_NxBxHxCxV = jax.lax.scan(step, f32(state), inputs)
    o = jnp.moveaxis(o_NxBxHxCxV, 0, 2).reshape(b, h, n * c, -1)[:, :, :l]
    return jnp.swapaxes(o, 1, 2), state


class GatedDeltaNet(nn.Module):
    """A decoder layer's Gated DeltaNet mixer: x [B, L, D] -> [B, L, D], the module docstring's equations.

    Weights: query/key [D, heads, K], value and the output gate z [D, v_heads, V], b and a [D, v_heads], the
    convolution [conv, 2 heads K + v_heads V], A_log and dt_bias [v_heads], the gated norm's gain [V], out
    [v_heads, V, D]. In decode mode the convolution's history and the state come from the cache and go back to it."""

    cfg: ModelConfig  # its linear_* sizes: txjax.model.linear_config

    @nn.compact
    def __call__(self, x_BxLxD, mask, *, decode=False):
        """mask: blockwise.Segments (the query side's segment ids [B, L], 0 = padding; a dense mask has no runs)."""
        cfg, size = self.cfg, linear_sizes(self.cfg)
        if not isinstance(mask, Segments):
            raise ValueError("Gated DeltaNet layers (model.layer_types) read segment ids, not a dense attention mask")
        (b, l, d), segments = x_BxLxD.shape, mask.q
        runs, own = runs_of(segments), (segments != 0)[..., None]
        q, k = (self.project(name, (size.heads, size.head_dim), x_BxLxD) for name in ("query", "key"))
        v, z = (self.project(name, (size.v_heads, size.v_head_dim), x_BxLxD) for name in ("value", "gate"))
        b_, a = (self.project(name, (size.v_heads,), x_BxLxD) for name in ("beta", "decay"))
        qkv = jnp.concatenate([t.reshape(b, l, -1) for t in (q, k, v)], axis=-1).astype(jnp.float32) * own
        kernel = self.param(
            "conv",
            roles.init(_conv_init(size.conv), (None, None), roles.EMBEDDING),  # per channel: vector-like
            (size.conv, size.conv_channels),
        )
        conv_shape, state_shape = (b, size.conv - 1, qkv.shape[-1]), (b, size.v_heads, size.head_dim, size.v_head_dim)
        if decode:
            conv_state, delta_state, index, is_init = linear_state_cache(self, conv_shape, state_shape)
            history, state = conv_state.value, delta_state.value
        else:
            history, state = jnp.zeros(conv_shape), jnp.zeros(state_shape)
        mixed, history = causal_conv(qkv, kernel, history, runs)
        q, k, v = jnp.split(mixed, (size.heads * size.head_dim, 2 * size.heads * size.head_dim), axis=-1)
        repeat = lambda t: jnp.repeat(t.reshape(b, l, size.heads, -1), size.v_heads // size.heads, axis=2)
        q, k = (repeat(l2_normalize(t.reshape(b, l, size.heads, -1))) for t in (q, k))
        a_log = self.param("A_log", roles.init(_a_log_init, ("heads",), roles.BIAS), (size.v_heads,))
        dt_bias = self.param("dt_bias", roles.init(_dt_bias_init, ("heads",), roles.BIAS), (size.v_heads,))
        g = -jnp.exp(a_log) * jax.nn.softplus(a.astype(jnp.float32) + dt_bias) * own  # padding: no decay
        beta = jax.nn.sigmoid(b_.astype(jnp.float32)) * own  # and no write
        o, state = chunked_delta_rule(
            q / size.head_dim**0.5, k, v.reshape(b, l, size.v_heads, -1), g, beta, runs, state, size.chunk
        )
        if decode and not is_init:  # model.init(decode=True) only allocates the cache
            conv_state.value, delta_state.value, index.value = history, state, index.value + l
        gain = self.param("norm", roles.init(nn.initializers.ones, ("kv",), roles.NORM), (size.v_head_dim,))
        o = o * jax.lax.rsqrt(jnp.mean(o * o, axis=-1, keepdims=True) + cfg.norm_eps) * gain
        o = o * jax.nn.silu(z.astype(jnp.float32))
        w_out = self.param(
            "out",
            roles.init(nn.initializers.normal(cfg.out_init_std), ("heads", "kv", "embed"), roles.OUT),
            (size.v_heads, size.v_head_dim, d),
        )
        dtype = cfg.compute_dtype
        return precision.einsum("blhv,hvd->bld", o.astype(dtype), w_out.astype(dtype))

    def project(self, name, heads, x_BxLxD):
        """x W: W [D, *heads] ~ N(0, hidden_init_std^2) -> [B, L, *heads] (q, k, v, z: [heads, dim]; b, a: [heads])."""
        spec, role = (("embed", "heads", "kv"), roles.QKV) if len(heads) == 2 else (("embed", "heads"), roles.MATRIX)
        init = roles.init(nn.initializers.normal(self.cfg.hidden_init_std), spec, role)
        w = self.param(name, init, (x_BxLxD.shape[-1], *heads))
        dtype = self.cfg.compute_dtype
        letters = "hk"[: len(heads)]
        return precision.einsum(f"bld,d{letters}->bl{letters}", x_BxLxD.astype(dtype), w.astype(dtype))


def _conv_init(width: int):
    """A depthwise convolution's taps ~ U(-1/sqrt(width), 1/sqrt(width)) (torch's Conv1d default, fan_in = width)."""
    bound = 1 / width**0.5
    return lambda key, shape, dtype=jnp.float32: jax.random.uniform(key, shape, dtype, -bound, bound)


def _a_log_init(key, shape, dtype=jnp.float32):
    """A_log = log A, A ~ U(1, 16): each head's decay rate (FLA's and Mamba 2's)."""
    return jnp.log(jax.random.uniform(key, shape, dtype, 1.0, 16.0))


def _dt_bias_init(key, shape, dtype=jnp.float32):
    """dt_bias = softplus^-1(dt), dt log-uniform in [1e-3, 1e-1] (Mamba's time steps)."""
    dt = jnp.exp(jax.random.uniform(key, shape, dtype, jnp.log(1e-3), jnp.log(1e-1)))
    return dt + jnp.log(-jnp.expm1(-dt))
