"""Norms, FFN and whole transformer blocks against NumPy computed from the modules' parameters."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_attention import np_mha, random_params

from txjax.model.config import ModelConfig
from txjax.model.ffn import FeedForward
from txjax.model.layers import Block
from txjax.model.masks import causal_mask, segment_mask
from txjax.model.norms import make_norm

pytestmark = pytest.mark.gpu  # the whole file is in the GPU subset (pyproject.toml's markers)

EPS = 1e-5


def _cfg(**kw):
    base = dict(vocab_size=7, d_model=8, num_heads=2, d_ff=12, num_layers=1, max_len=8, init_std=0.3)
    return ModelConfig(**{**base, **kw})


def np_layernorm(x, p):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return p["scale"] * (x - mu) / np.sqrt(var + EPS) + p["bias"]


def np_rmsnorm(x, p):
    return p["scale"] * x / np.sqrt((x**2).mean(-1, keepdims=True) + EPS)


def np_offset_rmsnorm(x, p):
    """Gemma's RMSNorm: the stored gain w applies as 1 + w."""
    return (1 + p["scale"]) * x / np.sqrt((x**2).mean(-1, keepdims=True) + EPS)


NP_NORMS = {"layernorm": np_layernorm, "rmsnorm": np_rmsnorm, "offset_rmsnorm": np_offset_rmsnorm}
NP_ACTS = {
    "relu": lambda x: np.maximum(x, 0),
    "gelu": lambda x: 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2))),
    "gelu_tanh": lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
}


def np_ffn(x, p, activation):
    """act(x W1 + b1) W2 + b2; SwiGLU: (silu(x W1) * x W3) W2."""
    lin = lambda name, h: h @ p[name]["kernel"] + p[name].get("bias", 0)
    if activation == "swiglu":
        a = lin("wi", x)
        h = a / (1 + np.exp(-a)) * lin("wi_gate", x)
    else:
        h = NP_ACTS[activation](lin("wi", x))
    return lin("wo", h)


def _np(tree):
    return jax.tree_util.tree_map(lambda w: np.asarray(w, np.float64), tree)


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm", "offset_rmsnorm"])
def test_norm_matches_numpy(norm):
    cfg = _cfg(norm=norm.removeprefix("offset_"), norm_offset=norm.startswith("offset_"))
    x = jnp.asarray(np.random.default_rng(0).normal(2.0, 3.0, size=(2, 3, 8)), jnp.float32)
    mod = make_norm(cfg)
    p = random_params(mod, x)
    assert set(p) == ({"scale", "bias"} if norm == "layernorm" else {"scale"})
    out = mod.apply({"params": p}, x)
    np.testing.assert_allclose(out, NP_NORMS[norm](np.asarray(x, np.float64), _np(p)), atol=1e-4)


@pytest.mark.parametrize(
    "activation,use_bias", [("relu", True), ("gelu", True), ("gelu_tanh", False), ("swiglu", False), ("swiglu", True)]
)
def test_ffn_matches_numpy(activation, use_bias):
    cfg = _cfg(activation=activation, use_bias=use_bias)
    x = jnp.asarray(np.random.default_rng(2).normal(size=(2, 3, 8)), jnp.float32)
    mod = FeedForward(cfg)
    p = random_params(mod, x)
    assert set(p) == ({"wi", "wi_gate", "wo"} if activation == "swiglu" else {"wi", "wo"})
    assert p["wi"]["kernel"].shape == (8, 12) and p["wo"]["kernel"].shape == (12, 8)
    assert ("bias" in p["wi"]) == use_bias
    np.testing.assert_allclose(
        mod.apply({"params": p}, x), np_ffn(np.asarray(x, np.float64), _np(p), activation), atol=1e-4
    )


def np_block(x, p, cfg, mask, enc=None, enc_mask=None):
    """Pre-LN:  t1 = LN(x); t3 = x + MHA(t1); [t5 = t3 + CrossMHA(LN(t3), enc)]; h = t5 + FFN(LN(t5)).
    Post-LN: t3 = LN(x + MHA(x)); [t5 = LN(t3 + CrossMHA(t3, enc))]; h = LN(t5 + FFN(t5)).  One example."""
    norm = NP_NORMS[cfg.norm]
    attn = lambda name, q, kv, m: np_mha(q, kv, p[name], cfg.num_heads, cfg.kv_heads, m)
    branches = [("self_attention", lambda t: attn("self_attention", t, t, mask))]
    if enc is not None:
        branches.append(("cross_attention", lambda t: attn("cross_attention", t, enc, enc_mask)))
    branches.append(("ffn", lambda t: np_ffn(t, p["ffn"], cfg.activation)))
    for name, f in branches:
        if cfg.norm_placement == "pre":
            x = x + f(norm(x, p[f"{name}_norm"]))
        else:
            x = norm(x + f(x), p[f"{name}_norm"])
    return x


@pytest.mark.parametrize(
    "placement,norm,activation,cross,kv_heads",
    [
        ("pre", "layernorm", "gelu", False, None),
        ("post", "layernorm", "relu", False, None),
        ("pre", "rmsnorm", "swiglu", True, 1),
        ("post", "layernorm", "relu", True, None),
    ],
)
def test_block_matches_numpy(placement, norm, activation, cross, kv_heads):
    cfg = _cfg(norm_placement=placement, norm=norm, activation=activation, use_bias=True, num_kv_heads=kv_heads)
    rng = np.random.default_rng(4)
    x = jnp.asarray(rng.normal(size=(2, 5, 8)), jnp.float32)
    pos = jnp.array([[0, 1, 2, 0, 1], [0, 1, 2, 3, 4]])
    seg = jnp.array([[1, 1, 1, 2, 2], [1, 1, 1, 1, 1]])
    ctx = {"mask": causal_mask(pos, pos) & segment_mask(seg, seg), "pos": pos}
    if cross:
        src_seg = jnp.array([[1, 1, 2, 0], [1, 1, 1, 1]])
        ctx["enc"] = jnp.asarray(rng.normal(size=(2, 4, 8)), jnp.float32)
        ctx["enc_mask"] = segment_mask(seg, src_seg)
    block = Block(cfg, cross=cross)
    p = random_params(block, x, ctx)
    out, _ = block.apply({"params": p}, x, ctx)
    pn = _np(p)
    for b in range(2):
        ref = np_block(
            np.asarray(x[b], np.float64),
            pn,
            cfg,
            np.asarray(ctx["mask"][b, 0]),
            None if not cross else np.asarray(ctx["enc"][b], np.float64),
            None if not cross else np.asarray(ctx["enc_mask"][b, 0]),
        )
        np.testing.assert_allclose(out[b], ref, atol=1e-4)


def test_block_dropout_only_when_not_deterministic():
    cfg = _cfg(dropout=0.5, attention_dropout=0.5)
    x = jnp.asarray(np.random.default_rng(6).normal(size=(1, 4, 8)), jnp.float32)
    pos = jnp.arange(4)[None]
    ctx = {"mask": causal_mask(pos, pos), "pos": pos}
    v = {"params": random_params(Block(cfg), x, ctx)}
    no_drop, _ = Block(_cfg()).apply(v, x, ctx)
    det, _ = Block(cfg).apply(v, x, ctx)
    np.testing.assert_allclose(det, no_drop, atol=1e-6)
    train = jax.jit(
        lambda seed: Block(cfg, deterministic=False).apply(v, x, ctx, rngs={"dropout": jax.random.key(seed)})[0]
    )
    assert not np.allclose(train(1), det, atol=1e-4)
    np.testing.assert_allclose(train(1), train(1))
