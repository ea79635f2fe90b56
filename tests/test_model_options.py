"""The recipe options of the model and the objective, each against NumPy written here: QK-norm, logit soft-capping,
ReLU^2 and z-loss."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txjax.families.objective import token_sums
from txjax.model.config import ModelConfig
from txjax.model.ffn import FeedForward
from txjax.model.models import DecoderLM
from txjax.model.multi_head import MultiHeadAttention

RNG = np.random.default_rng(0)


def randomized(variables):
    """Every parameter drawn N(0, 0.5^2) (norm scales too, so that they matter)."""
    return jax.tree.map(lambda p: jnp.asarray(RNG.normal(0.0, 0.5, p.shape), jnp.float32), nn.meta.unbox(variables))


def rms_norm(x, g, eps=1e-5):
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * g


def softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("all_heads", [False, True])
def test_qk_norm_normalizes_q_and_k_per_head_before_the_scores(all_heads):
    """Per head: RMS over each head's d_k; all_heads (OLMoE): over the whole projection, gains [heads, d_k]."""
    d, h, k = 8, 2, 4
    mha = MultiHeadAttention(num_heads=h, num_kv_heads=h, head_dim=k, qk_norm=True, qk_norm_all_heads=all_heads)
    x = jnp.asarray(RNG.normal(size=(1, 5, d)), jnp.float32)
    pos = jnp.arange(5)[None]
    params = randomized(jax.eval_shape(mha.init, jax.random.key(0), x, None, q_pos=pos))["params"]
    out = np.asarray(mha.apply({"params": params}, x, None, q_pos=pos))
    p = jax.tree.map(np.asarray, params)
    x0 = np.asarray(x[0])
    assert p["query_norm"]["scale"].shape == ((h, k) if all_heads else (k,))
    norm = lambda t, g: rms_norm(t.reshape(5, -1), g.reshape(-1)).reshape(5, h, k) if all_heads else rms_norm(t, g)
    q = norm(np.einsum("ld,dhk->lhk", x0, p["query"]), p["query_norm"]["scale"])
    kk = norm(np.einsum("ld,dhk->lhk", x0, p["key"]), p["key_norm"]["scale"])
    v = np.einsum("ld,dhk->lhk", x0, p["value"])
    probs = softmax(np.einsum("qhk,shk->hqs", q, kk) / np.sqrt(k))
    expected = np.einsum("hqs,shk,hkd->qd", probs, v, p["out"])
    np.testing.assert_allclose(out[0], expected, rtol=2e-5, atol=2e-5)


def test_logit_softcap_is_c_tanh_of_the_uncapped_logits():
    cfg = ModelConfig(vocab_size=11, d_model=16, num_heads=2, d_ff=32, num_layers=1, max_len=8)
    tokens = jnp.asarray(RNG.integers(0, 11, size=(2, 6)), jnp.int32)
    params = randomized(jax.eval_shape(DecoderLM(cfg).init, jax.random.key(0), tokens))["params"]
    plain = np.asarray(DecoderLM(cfg).apply({"params": params}, tokens), np.float64)
    capped = np.asarray(DecoderLM(dataclasses.replace(cfg, logit_softcap=1.5)).apply({"params": params}, tokens))
    assert np.abs(plain).max() > 1.0  # the cap bends these logits (c = 1.5)
    np.testing.assert_allclose(capped, 1.5 * np.tanh(plain / 1.5), rtol=1e-5, atol=1e-6)


def test_relu2_ffn_is_relu_squared():
    cfg = ModelConfig(vocab_size=11, d_model=8, num_heads=2, d_ff=16, num_layers=1, activation="relu2")
    ffn = FeedForward(cfg)
    x = jnp.asarray(RNG.normal(size=(1, 3, 8)), jnp.float32)
    params = randomized(jax.eval_shape(ffn.init, jax.random.key(0), x))["params"]
    p = jax.tree.map(
        lambda leaf: np.asarray(getattr(leaf, "value", leaf)), params, is_leaf=lambda n: hasattr(n, "value")
    )
    expected = np.maximum(np.asarray(x[0]) @ p["wi"]["kernel"], 0.0) ** 2 @ p["wo"]["kernel"]
    np.testing.assert_allclose(np.asarray(ffn.apply({"params": params}, x))[0], expected, rtol=1e-5, atol=1e-5)


def test_z_loss_adds_the_squared_log_partition():
    logits = RNG.normal(size=(2, 3, 7)).astype(np.float32) * 3
    targets, weights = RNG.integers(0, 7, size=(2, 3)), np.array([[1, 1, 0], [1, 0, 1]], np.float32)
    sums = token_sums(jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(weights), z_loss=1e-2)
    log_z = np.log(np.exp(logits.astype(np.float64)).sum(-1))
    ce = log_z - np.take_along_axis(logits, targets[..., None], -1)[..., 0]
    np.testing.assert_allclose(sums["loss"], (weights * ce).sum(), rtol=1e-5)
    np.testing.assert_allclose(sums["objective"], (weights * (ce + 1e-2 * log_z**2)).sum(), rtol=1e-5)
