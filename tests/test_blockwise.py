"""Blockwise attention against NumPy written here (outputs and the gradients of softmax attention, per head), and a
model trained with it against the reference attention."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from txjax.model import blockwise
from txjax.model.config import ModelConfig
from txjax.model.models import DecoderLM, EncoderDecoder
from txjax.model.positional import alibi_slopes

RNG = np.random.default_rng(0)


def np_attention_and_grads(q, k, v, allowed, bias, scale, d_out, softcap=0.0):
    """Per head: O = P V with P = softmax over the allowed keys of q k^T * scale + bias, and for the loss sum(O * d_out)
    dV = P^T dO, dP = dO V^T, dS = P (dP - rowsum(dP P)), dQ = dS K scale, dK = dS^T Q scale. q [L, H, K], k/v
    [S, G, K] (head h reads K/V head h // (H/G)), allowed [L, S], bias [H, L, S]; rows with no allowed key are 0.
    softcap c > 0: the scores are c tanh(q k^T * scale / c) + bias, and dS is times 1 - tanh^2."""
    q, k, v, d_out = (np.asarray(t, np.float64) for t in (q, k, v, d_out))
    h, g = q.shape[1], k.shape[1]
    out, dq, dk, dv = np.zeros_like(q), np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for head in range(h):
        kv = head // (h // g)
        raw = q[:, head] @ k[:, kv].T * scale
        capped = softcap * np.tanh(raw / softcap) if softcap else raw
        s = capped + bias[head]
        s = np.where(allowed, s, -np.inf)
        e = np.exp(s - np.where(allowed.any(1, keepdims=True), s.max(1, keepdims=True), 0.0))
        p = np.where(allowed, e, 0.0) / np.maximum(e.sum(1, keepdims=True), 1e-300)
        out[:, head] = p @ v[:, kv]
        dp = d_out[:, head] @ v[:, kv].T
        ds = p * (dp - (dp * p).sum(1, keepdims=True)) * ((1 - (capped / softcap) ** 2) if softcap else 1.0)
        dv[:, kv] += p.T @ d_out[:, head]
        dq[:, head] = ds @ k[:, kv] * scale
        dk[:, kv] += ds.T @ q[:, head] * scale
    return out, dq, dk, dv


def case(b=2, l=19, s=19, h=4, g=2, kd=8, packed=True):
    """Random q, k, v; rows 0: two segments and padding, row 1: one segment (s == l for self-attention)."""
    q, d_out = (RNG.normal(size=(b, l, h, kd)).astype(np.float32) for _ in range(2))
    k, v = (RNG.normal(size=(b, s, g, kd)).astype(np.float32) for _ in range(2))
    seg_q, seg_k = np.ones((b, l), np.int32), np.ones((b, s), np.int32)
    if packed:
        seg_q[0, l // 2 :], seg_q[0, l - 3 :] = 2, 0
        seg_k[0, s // 2 :], seg_k[0, s - 3 :] = 2, 0
    pos = lambda seg: np.stack([np.concatenate([np.arange((r == i).sum()) for i in (1, 2, 0)]) for r in seg])
    return q, k, v, d_out, seg_q, seg_k, pos(seg_q), pos(seg_k)


def run(q, k, v, d_out, seg_q, seg_k, pos_q, pos_k, causal, alibi, block_q, block_kv, softcap=0.0):
    slopes = alibi_slopes(q.shape[2]) if alibi else None
    scale = q.shape[-1] ** -0.5

    def f(q, k, v):
        segments = blockwise.Segments(jnp.asarray(seg_q), jnp.asarray(seg_k))
        kw = dict(
            causal=causal,
            heads_H={} if slopes is None else {"slopes": slopes},
            scale=scale,
            block_q=block_q,
            block_kv=block_kv,
            softcap=softcap,
        )
        return blockwise.attention(q, k, v, segments, jnp.asarray(pos_q), jnp.asarray(pos_k), **kw)

    out, vjp = jax.vjp(jax.jit(f), q, k, v)
    return (out, *vjp(jnp.asarray(d_out, out.dtype)))


def expected(q, k, v, d_out, seg_q, seg_k, pos_q, pos_k, causal, alibi, softcap=0.0):
    rows = []
    h = q.shape[2]
    slopes = np.asarray(alibi_slopes(h), np.float64)
    for r in range(q.shape[0]):
        allowed = (seg_q[r, :, None] == seg_k[r, None, :]) & (seg_q[r, :, None] > 0) & (seg_k[r, None, :] > 0)
        if causal:
            allowed &= pos_k[r, None, :] <= pos_q[r, :, None]
        dist = np.abs(pos_q[r, :, None] - pos_k[r, None, :])
        bias = -slopes[:, None, None] * dist if alibi else np.zeros((h, *dist.shape))
        rows.append(np_attention_and_grads(q[r], k[r], v[r], allowed, bias, q.shape[-1] ** -0.5, d_out[r], softcap))
    return [np.stack(t) for t in zip(*rows)]


@pytest.mark.parametrize("block_q,block_kv", [(4, 4), (5, 8), (8, 3), (64, 64)])  # ragged last blocks; one block
@pytest.mark.parametrize("causal,alibi", [(True, False), (True, True), (False, False)])
def test_outputs_and_gradients_match_numpy(block_q, block_kv, causal, alibi):
    c = case()
    got = run(*c, causal, alibi, block_q, block_kv)
    for name, g, e in zip(("out", "dq", "dk", "dv"), got, expected(*c, causal, alibi)):
        np.testing.assert_allclose(np.asarray(g), e, rtol=2e-5, atol=2e-5, err_msg=name)


def test_soft_capped_scores_outputs_and_gradients_match_numpy():
    """Gemma 2's c tanh(s / c) on the scores (c small enough to bind: the scores reach about 3c), ALiBi after it."""
    c = case()
    got = run(*c, True, True, 5, 8, softcap=1.0)
    for name, g, e in zip(("out", "dq", "dk", "dv"), got, expected(*c, True, True, softcap=1.0)):
        np.testing.assert_allclose(np.asarray(g), e, rtol=2e-5, atol=2e-5, err_msg=name)


def test_cross_attention_lengths_and_one_kv_head():
    c = case(l=11, s=23, g=1)
    got = run(*c, False, False, 4, 6)
    for name, g, e in zip(("out", "dq", "dk", "dv"), got, expected(*c, False, False)):
        np.testing.assert_allclose(np.asarray(g), e, rtol=2e-5, atol=2e-5, err_msg=name)


def test_bfloat16_within_its_rounding():
    q, k, v, d_out, *rest = case()
    bf = lambda t: np.asarray(jnp.asarray(t, jnp.bfloat16).astype(jnp.float32))
    q, k, v, d_out = map(bf, (q, k, v, d_out))
    got = run(*(jnp.asarray(t, jnp.bfloat16) for t in (q, k, v, d_out)), *rest, True, True, 8, 4)
    for name, g, e in zip(("out", "dq", "dk", "dv"), got, expected(q, k, v, d_out, *rest, True, True)):
        assert g.dtype == jnp.bfloat16
        np.testing.assert_allclose(np.asarray(g.astype(jnp.float32)), e, rtol=3e-2, atol=3e-2, err_msg=name)


def test_causal_blocks_past_the_diagonal_are_not_computed():
    """Values of the last key block are NaN: a query block before it stays finite only if its product is skipped
    (masked weights 0 times NaN would be NaN), while the queries of that block read it."""
    q, k, v, d_out, *_ = case(b=1, l=16, s=16, packed=False)
    v[:, 12:] = np.nan
    pos, seg = np.arange(16)[None], np.ones((1, 16), np.int32)
    out = np.asarray(run(q, k, v, d_out, seg, seg, pos, pos, True, False, 4, 4)[0])
    assert np.isfinite(out[:, :12]).all() and np.isnan(out[:, 12:]).all()


def test_a_model_trained_with_blockwise_attention_equals_the_reference():
    cfg = ModelConfig(
        vocab_size=13, d_model=32, num_heads=4, num_kv_heads=2, d_ff=64, num_layers=2, max_len=24, positional="rope"
    )
    tokens = jnp.asarray(RNG.integers(0, 13, size=(2, 22)), jnp.int32)
    segments = jnp.asarray(np.where(np.arange(22) < 9, 1, 2)[None].repeat(2, 0), jnp.int32)
    positions = jnp.where(segments == 1, jnp.arange(22), jnp.arange(22) - 9)
    params = jax.jit(lambda: DecoderLM(cfg).init(jax.random.key(0), tokens)["params"])()
    tx = optax.adam(1e-2)

    def train(cfg):
        model = DecoderLM(cfg)

        def loss(p):
            logits = model.apply({"params": p}, tokens[:, :-1], positions[:, :-1], segments[:, :-1])
            return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

        @jax.jit
        def step(p, opt):
            value, grads = jax.value_and_grad(loss)(p)
            updates, opt = tx.update(grads, opt, p)
            return optax.apply_updates(p, updates), opt, value

        p, opt, losses = params, tx.init(params), []
        for _ in range(4):
            p, opt, value = step(p, opt)
            losses.append(float(value))
        return p, losses

    ref_params, ref_losses = train(dataclasses.replace(cfg, attention_impl="reference"))
    blk = dataclasses.replace(cfg, attention_impl="blockwise", attention_block_q=8, attention_block_kv=4)
    blk_params, blk_losses = train(blk)
    np.testing.assert_allclose(blk_losses, ref_losses, rtol=1e-5)
    assert ref_losses[-1] < ref_losses[0]
    for a, b in zip(jax.tree.leaves(blk_params), jax.tree.leaves(ref_params)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_an_encoder_decoder_with_blockwise_attention_equals_the_reference():
    """Padded sources: bidirectional self-attention, cross-attention (lengths 11 and 7) and the decoder's causal one."""
    cfg = ModelConfig(vocab_size=13, d_model=32, num_heads=4, d_ff=64, num_layers=1, max_len=16, positional="alibi")
    src, tgt = (jnp.asarray(RNG.integers(1, 13, size=(2, n)), jnp.int32) for n in (11, 7))
    src_seg = jnp.asarray([[1] * 11, [1] * 6 + [0] * 5], jnp.int32)
    params = jax.jit(lambda: EncoderDecoder(cfg).init(jax.random.key(0), src, tgt)["params"])()
    # jitted: op by op, the blockwise loops' every primitive was compiled on its own
    run = lambda cfg: jax.jit(lambda p: EncoderDecoder(cfg).apply({"params": p}, src, tgt, src_segment_ids=src_seg))(
        params
    )
    blk = dataclasses.replace(cfg, attention_impl="blockwise", attention_block_q=4, attention_block_kv=3)
    np.testing.assert_allclose(
        run(blk), run(dataclasses.replace(cfg, attention_impl="reference")), rtol=1e-5, atol=1e-5
    )


def test_config_refuses_attention_dropout_and_empty_blocks():
    with pytest.raises(ValueError, match="attention_dropout=0"):
        ModelConfig(vocab_size=5, attention_impl="blockwise", attention_dropout=0.1)
    with pytest.raises(ValueError, match="attention_block_kv"):
        ModelConfig(vocab_size=5, attention_block_kv=0)
