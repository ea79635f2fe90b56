"""Attention equation, masks and multi-head attention against plain NumPy written here (not against txjax)."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_decode_kernels import forward  # jitted: op by op, each primitive of a module compiled alone

from txjax.model import attention as A
from txjax.model import masks as M
from txjax.model.multi_head import MultiHeadAttention
from txjax.model.score import Spec

pytestmark = pytest.mark.gpu  # the whole file is in the GPU subset (pyproject.toml's markers)

# ----------------------------------------------------------------------------------------------------------------
# NumPy references (also imported by test_layers.py)


def np_softmax(s, axis=-1):
    s = s - s.max(axis=axis, keepdims=True)
    e = np.exp(s)
    return e / e.sum(axis=axis, keepdims=True)


def np_attention(q, k, v, mask=None, bias=None, scale=None, softcap=0.0):
    """softmax(q k^T / sqrt(d_k) + bias) v over allowed keys, with explicit loops over the query rows; softcap c > 0:
    the scores q k^T * scale become c tanh(scores / c) before the bias."""
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ np.swapaxes(k, -1, -2) * scale
    if softcap:
        scores = softcap * np.tanh(scores / softcap)
    if bias is not None:
        scores = scores + bias
    if mask is None:
        return np_softmax(scores) @ v
    mask = np.broadcast_to(mask, scores.shape)
    out = np.zeros(scores.shape[:-1] + (v.shape[-1],))
    for idx in np.ndindex(*scores.shape[:-1]):
        allowed = mask[idx]
        if allowed.any():
            p = np_softmax(scores[idx][allowed])
            out[idx] = p @ v[idx[:-1]][allowed]
    return out


def np_mha(x, kv, p, num_heads, num_kv_heads, mask=None, bias=None, scale=None):
    """Concat_i(Attention(x W_i^Q, kv W_i^K, kv W_i^V)) W^O for one example; 3h+1 matrices, one head at a time.

    x [Lq, D], kv [Lk, D]; p: 'query' [D,H,K], 'key'/'value' [D,G,K], 'out' [H,K,D] (+ '*_bias');
    mask [Lq, Lk] bool; bias [H, Lq, Lk]. Query head i uses K/V head i // (H/G).
    """
    p = {name: np.asarray(w, np.float64) for name, w in p.items()}
    group = num_heads // num_kv_heads
    heads = []
    for i in range(num_heads):
        j = i // group
        q = x @ p["query"][:, i, :] + (p["query_bias"][i] if "query_bias" in p else 0)
        k = kv @ p["key"][:, j, :] + (p["key_bias"][j] if "key_bias" in p else 0)
        v = kv @ p["value"][:, j, :] + (p["value_bias"][j] if "value_bias" in p else 0)
        heads.append(np_attention(q, k, v, mask, None if bias is None else bias[i], scale))
    w_o = p["out"].reshape(-1, p["out"].shape[-1])  # [H*K, D]
    return np.concatenate(heads, axis=-1) @ w_o + (p["out_bias"] if "out_bias" in p else 0)


# ----------------------------------------------------------------------------------------------------------------
# The equation


def test_sdpa_matches_numpy_dk_ne_dv_nq_ne_nk_with_mask_and_bias():
    rng = np.random.default_rng(0)
    q = rng.normal(size=(2, 3, 4, 5)).astype(np.float32)  # [..., n_q=4, d_k=5]
    k = rng.normal(size=(2, 3, 6, 5)).astype(np.float32)  # n_k=6
    v = rng.normal(size=(2, 3, 6, 7)).astype(np.float32)  # d_v=7
    mask = rng.random((2, 1, 4, 6)) < 0.7
    mask[0, 0, 1] = False  # one fully masked row
    bias = rng.normal(size=(1, 3, 4, 6)).astype(np.float32)
    out = A.scaled_dot_product_attention(q, k, v, mask)
    assert out.shape == (2, 3, 4, 7)
    np.testing.assert_allclose(out, np_attention(q, k, v, mask), atol=1e-5)
    out_b = A.scaled_dot_product_attention(q, k, v, mask, bias=bias)
    np.testing.assert_allclose(out_b, np_attention(q, k, v, mask, bias), atol=1e-5)
    np.testing.assert_allclose(A.scaled_dot_product_attention(q, k, v), np_attention(q, k, v), atol=1e-5)
    np.testing.assert_allclose(
        A.scaled_dot_product_attention(q, k, v, scale=0.3), np_attention(q, k, v, scale=0.3), atol=1e-5
    )
    capped = A.scaled_dot_product_attention(q, k, v, mask, bias=bias, softcap=0.5)  # binds: the scores reach ~3
    np.testing.assert_allclose(capped, np_attention(q, k, v, mask, bias, softcap=0.5), atol=1e-5)


def test_fully_masked_row_gives_zeros_and_finite_grads():
    rng = np.random.default_rng(1)
    q, k, v = (jnp.asarray(rng.normal(size=s), jnp.float32) for s in [(3, 4), (5, 4), (5, 2)])
    mask = np.ones((3, 5), bool)
    mask[1] = False
    sdpa = lambda q, k, v: A.scaled_dot_product_attention(q, k, v, mask)
    out = jax.jit(sdpa)(q, k, v)  # jitted, as the gradient: op by op, each primitive compiled alone
    assert not np.isnan(np.asarray(out)).any()
    np.testing.assert_array_equal(np.asarray(out)[1], 0.0)
    np.testing.assert_allclose(np.asarray(out)[[0, 2]], np_attention(q, k, v, mask)[[0, 2]], atol=1e-5)
    grads = jax.jit(jax.grad(lambda q, k, v: sdpa(q, k, v).sum(), argnums=(0, 1, 2)))(q, k, v)
    assert all(np.isfinite(np.asarray(g)).all() for g in grads)


def test_softmax_in_float32_for_bfloat16_inputs():
    rng = np.random.default_rng(2)
    q, k = (jnp.asarray(rng.normal(size=(4, 8)), jnp.bfloat16) for _ in range(2))
    w = A.attention_weights(q, k)
    assert w.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(w).sum(-1), 1.0, atol=1e-6)


# ----------------------------------------------------------------------------------------------------------------
# Masks


def test_causal_mask_on_positions():
    pos = np.array([[0, 1, 2, 3], [0, 1, 0, 1]])
    m = np.asarray(M.causal_mask(jnp.asarray(pos), jnp.asarray(pos)))
    assert m.shape == (2, 1, 4, 4)
    np.testing.assert_array_equal(m[0, 0], np.tril(np.ones((4, 4), bool)))
    ref = np.array([[pos[b, j] <= pos[b, i] for j in range(4)] for b in range(2) for i in range(4)]).reshape(2, 4, 4)
    np.testing.assert_array_equal(m[:, 0], ref)
    # decode step: one query at position 2 over 5 cache positions
    m1 = np.asarray(M.causal_mask(jnp.array([[2]]), jnp.arange(5)[None]))
    np.testing.assert_array_equal(m1[0, 0, 0], [True, True, True, False, False])


def test_padding_mask():
    qv, kv = np.array([[1, 1, 0]], bool), np.array([[1, 0, 1, 1]], bool)
    m = np.asarray(M.padding_mask(jnp.asarray(qv), jnp.asarray(kv)))
    assert m.shape == (1, 1, 3, 4)
    np.testing.assert_array_equal(m[0, 0], np.outer(qv[0], kv[0]))


def test_segment_mask_and_causal():
    seg = np.array([[1, 1, 2, 2, 2, 0]])
    m = np.asarray(M.segment_mask(jnp.asarray(seg), jnp.asarray(seg)))[0, 0]
    ref = np.array([[seg[0, i] == seg[0, j] and seg[0, i] > 0 for j in range(6)] for i in range(6)])
    np.testing.assert_array_equal(m, ref)
    assert not m[5].any() and not m[:, 5].any()
    pos = jnp.array([[0, 1, 0, 1, 2, 0]])
    both = np.asarray(M.causal_mask(pos, pos) & M.segment_mask(jnp.asarray(seg), jnp.asarray(seg)))
    np.testing.assert_array_equal(both[0, 0], ref & np.tril(np.ones((6, 6), bool)))


# ----------------------------------------------------------------------------------------------------------------
# The write-ups' statistical claim: Var(q . k) = d_k for i.i.d. unit-variance components, 1 after the 1/sqrt(d_k)


@pytest.mark.parametrize("d_k", [4, 16, 64, 256])
def test_dot_product_variance_grows_with_dk_and_scale_fixes_it(d_k):
    n = 20000
    rng = np.random.default_rng(d_k)
    q = jnp.asarray(rng.standard_normal((n, d_k)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((n, d_k)), jnp.float32)
    dots = np.asarray(jnp.einsum("nd,nd->n", q, k), np.float64)  # n independent samples of q . k
    # q . k is a sum of d_k independent products with mean 0, variance 1 and 4th moment 9, so
    # E = 0, Var = d_k, and the sample variance has sd sqrt((mu4 - Var^2) / n) = sqrt((2 d_k^2 + 6 d_k) / n).
    assert abs(dots.mean()) < 5 * math.sqrt(d_k / n)
    var_sd = math.sqrt((2 * d_k**2 + 6 * d_k) / n)
    assert abs(dots.var() - d_k) < 5 * var_sd
    assert abs((dots / math.sqrt(d_k)).var() - 1.0) < 5 * var_sd / d_k
    # and the library's scores use exactly that scale: softmax(q k^T / sqrt(d_k))
    w = np.asarray(A.attention_weights(q[:3], k[:5]))
    np.testing.assert_allclose(w, np_softmax(np.asarray(q[:3] @ k[:5].T, np.float64) / math.sqrt(d_k)), atol=1e-5)


# ----------------------------------------------------------------------------------------------------------------
# Multi-head attention against the per-head NumPy loop


def random_params(module, *args, seed=0, std=0.3, **kwargs):
    """Parameters of `module` drawn here with NumPy (no init compile): N(0, std^2) everywhere, norm gains
    1 + N(0, 0.2^2), biases included so that they are tested. Shapes come from the module's init (eval_shape)."""
    shapes = jax.eval_shape(lambda: nn.meta.unbox(module.init(jax.random.key(0), *args, **kwargs)["params"]))
    rng = np.random.default_rng(seed)

    def fill(path, s):
        assert s.dtype == jnp.float32
        center = 1.0 if getattr(path[-1], "key", None) == "scale" else 0.0
        return jnp.asarray(center + (0.2 if center else std) * rng.normal(size=s.shape), jnp.float32)

    return jax.tree_util.tree_map_with_path(fill, shapes)


@pytest.mark.parametrize(
    "num_heads,num_kv_heads,scale", [(4, 4, "sqrt"), (4, 2, "sqrt"), (4, 1, "none"), (4, 2, "linear")]
)
def test_mha_self_attention_matches_numpy(num_heads, num_kv_heads, scale):
    d_model, head_dim, b, l = 10, 3, 2, 5  # head_dim * heads != d_model on purpose
    mod = MultiHeadAttention(num_heads, num_kv_heads, head_dim, use_bias=True, score=Spec(scale=scale))
    rng = np.random.default_rng(4)
    x = jnp.asarray(rng.normal(size=(b, l, d_model)), jnp.float32)
    pos = jnp.broadcast_to(jnp.arange(l), (b, l))
    mask = M.causal_mask(pos, pos)
    p = random_params(mod, x, mask, q_pos=pos)
    assert p["query"].shape == (d_model, num_heads, head_dim) and p["key"].shape == (d_model, num_kv_heads, head_dim)
    assert p["out"].shape == (num_heads, head_dim, d_model)
    out = forward(mod, p, x, mask, q_pos=pos)
    s = {"sqrt": head_dim**-0.5, "none": 1.0, "linear": 1.0 / head_dim}[scale]
    for i in range(b):
        ref = np_mha(np.asarray(x[i]), np.asarray(x[i]), p, num_heads, num_kv_heads, np.asarray(mask[i, 0]), scale=s)
        np.testing.assert_allclose(out[i], ref, atol=2e-5)


@pytest.mark.parametrize("num_kv_heads", [3, 1])
def test_mha_cross_attention_different_lengths_matches_numpy(num_kv_heads):
    d_model, heads, head_dim = 8, 3, 4
    mod = MultiHeadAttention(heads, num_kv_heads, head_dim, cross=True)
    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.normal(size=(2, 3, d_model)), jnp.float32)  # Lq = 3
    enc = jnp.asarray(rng.normal(size=(2, 7, d_model)), jnp.float32)  # Lk = 7
    src_valid = jnp.arange(7)[None, :] < jnp.array([7, 4])[:, None]
    mask = M.padding_mask(jnp.ones((2, 3), bool), src_valid)
    q_pos = jnp.zeros((2, 3), jnp.int32)
    p = random_params(mod, x, mask, q_pos=q_pos, kv=enc)
    out = forward(mod, p, x, mask, q_pos=q_pos, kv=enc)
    assert out.shape == (2, 3, d_model)
    for i in range(2):
        ref = np_mha(np.asarray(x[i]), np.asarray(enc[i]), p, heads, num_kv_heads, np.asarray(mask[i, 0]))
        np.testing.assert_allclose(out[i], ref, atol=2e-5)


def test_mha_alibi_bias_matches_numpy():
    d_model, heads, head_dim, l = 8, 4, 2, 5
    mod = MultiHeadAttention(heads, 2, head_dim, score=Spec(alibi=True))
    rng = np.random.default_rng(6)
    x = jnp.asarray(rng.normal(size=(1, l, d_model)), jnp.float32)
    pos = jnp.arange(l)[None]
    mask = M.causal_mask(pos, pos)
    p = random_params(mod, x, mask, q_pos=pos)
    out = forward(mod, p, x, mask, q_pos=pos)
    slopes = 2.0 ** (-8.0 * np.arange(1, heads + 1) / heads)
    i, j = np.arange(l)[:, None], np.arange(l)[None, :]
    bias = -slopes[:, None, None] * (i - j)[None]  # the paper's -m_h (i - j) on the causal keys
    ref = np_mha(np.asarray(x[0]), np.asarray(x[0]), p, heads, 2, np.asarray(mask[0, 0]), bias=bias)
    np.testing.assert_allclose(out[0], ref, atol=2e-5)


def test_mha_sows_attention_weights():
    mod = MultiHeadAttention(2, 2, 4, sow_weights=True)
    x = jnp.asarray(np.random.default_rng(7).normal(size=(1, 4, 8)), jnp.float32)
    pos = jnp.arange(4)[None]
    mask = M.causal_mask(pos, pos)
    p = random_params(mod, x, mask, q_pos=pos)
    _, inter = forward(mod, p, x, mask, q_pos=pos, mutable=["intermediates"])
    (w,) = inter["intermediates"]["attention_weights"]
    assert w.shape == (1, 2, 4, 4)
    np.testing.assert_allclose(np.asarray(w).sum(-1), 1.0, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(w)[0, :, 0, 1:], 0.0)  # causal


# ----------------------------------------------------------------------------------------------------------------
# Fused path (jax.nn.dot_product_attention) == the einsum/vmap reference


@pytest.mark.parametrize("num_kv_heads,alibi", [(4, False), (2, True), (1, False)])
def test_fused_equals_reference_with_causal_padding_segments(num_kv_heads, alibi):
    d_model, heads, head_dim = 8, 4, 4
    seg = jnp.array([[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 0, 0]])  # packed row with a pad; padded row
    pos = jnp.array([[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 0]])
    mask = M.causal_mask(pos, pos) & M.segment_mask(seg, seg)
    x = jnp.asarray(np.random.default_rng(8).normal(size=(2, 6, d_model)), jnp.float32)
    kw = dict(num_heads=heads, num_kv_heads=num_kv_heads, head_dim=head_dim, score=Spec(alibi=alibi))
    ref_mod, fused_mod = MultiHeadAttention(**kw), MultiHeadAttention(**kw, impl="fused")
    variables = {"params": random_params(ref_mod, x, mask, q_pos=pos)}

    def out_and_grad(mod):
        apply = lambda v: mod.apply(v, x, mask, q_pos=pos)
        return jax.jit(lambda v: (apply(v), jax.grad(lambda v: (apply(v) ** 2).sum())(v)))(variables)

    (out_ref, g_ref), (out_fused, g_fused) = out_and_grad(ref_mod), out_and_grad(fused_mod)
    np.testing.assert_allclose(out_fused, out_ref, atol=1e-5)
    assert np.all(np.asarray(out_fused)[0, 5] == 0) and np.all(np.asarray(out_fused)[1, 4:] == 0)  # pad queries
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), g_fused, g_ref)
    # the fused path must not ignore the segment ids: it differs from an unmasked-by-segment call
    causal_only = M.causal_mask(pos, pos)
    assert not np.allclose(
        forward(fused_mod, variables["params"], x, causal_only, q_pos=pos)[0, 3:5], out_fused[0, 3:5]
    )


def test_fused_cross_attention_equals_reference():
    mod_kw = dict(num_heads=2, num_kv_heads=1, head_dim=4, cross=True)
    rng = np.random.default_rng(9)
    x = jnp.asarray(rng.normal(size=(2, 3, 8)), jnp.float32)
    enc = jnp.asarray(rng.normal(size=(2, 5, 8)), jnp.float32)
    mask = M.segment_mask(jnp.array([[1, 1, 0], [1, 1, 1]]), jnp.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]))
    q_pos = jnp.zeros((2, 3), jnp.int32)
    p = random_params(MultiHeadAttention(**mod_kw), x, mask, q_pos=q_pos, kv=enc)
    ref = forward(MultiHeadAttention(**mod_kw), p, x, mask, q_pos=q_pos, kv=enc)
    fused = forward(MultiHeadAttention(**mod_kw, impl="fused"), p, x, mask, q_pos=q_pos, kv=enc)
    np.testing.assert_allclose(fused, ref, atol=1e-5)
