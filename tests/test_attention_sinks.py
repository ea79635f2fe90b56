"""Attention sinks (GPT-OSS; model.attention_sinks): a learned logit per head in the softmax's denominator. The dense
form (score.weights) and blockwise attention's online softmax with its custom VJP (the sink's gradient included)
against the definition written here: softmax over [scores, sink_h], the sink's column dropped. (Every backend and
decoding layout against the full forward pass: tests/test_score_everywhere.py; the parameter's role:
tests/test_roles.py.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_blockwise import case

from txjax.model import attention, blockwise, masks, score


def by_definition(q, k, v, sinks, allowed, scale):
    """softmax([q k^T * scale over the allowed keys, sink_h]) without its last column, times v: q [B, L, H, K], k/v
    [B, S, G, K], sinks [H], allowed [B, L, S]."""
    r = q.shape[2] // k.shape[2]
    k, v = jnp.repeat(k, r, axis=2), jnp.repeat(v, r, axis=2)
    s = jnp.where(allowed[:, None], jnp.einsum("blhk,bshk->bhls", q, k) * scale, -jnp.inf)
    sink = jnp.broadcast_to(sinks[None, :, None, None], (*s.shape[:3], 1))
    p = jax.nn.softmax(jnp.concatenate([s, sink], -1), -1)[..., :-1]
    return jnp.einsum("bhls,bshk->blhk", p, v)


@pytest.mark.parametrize("block_q,block_kv", [(4, 4), (5, 3)])
def test_blockwise_and_dense_outputs_and_gradients_are_the_definitions(block_q, block_kv):
    q, k, v, d_out, seg_q, seg_k, pos_q, pos_k = (jnp.asarray(t) for t in case())
    sinks = jnp.asarray(np.random.default_rng(1).normal(0, 2.0, q.shape[2]), jnp.float32)
    scale = q.shape[-1] ** -0.5
    allowed = (masks.segment_mask(seg_q, seg_k) & masks.causal_mask(pos_q, pos_k))[:, 0]

    def flash(q, k, v, sinks):
        kw = dict(causal=True, heads_H={"sinks": sinks}, scale=scale, block_q=block_q, block_kv=block_kv)
        return blockwise.attention(q, k, v, blockwise.Segments(seg_q, seg_k), pos_q, pos_k, **kw)

    def dense(q, k, v, sinks):
        terms = score.Terms(scale, mask=allowed[:, None], sinks=sinks[None, :, None, None])
        return attention.attend(q, k, v, terms)[0]

    want, want_vjp = jax.vjp(lambda *a: by_definition(*a, allowed, scale), q, k, v, sinks)
    want_grads = want_vjp(d_out)
    for fn in (flash, dense):
        got, vjp = jax.vjp(jax.jit(fn), q, k, v, sinks)
        np.testing.assert_allclose(got, want, atol=2e-5, err_msg=fn.__name__)
        for name, g, w in zip(("dq", "dk", "dv", "dsinks"), vjp(d_out), want_grads):
            np.testing.assert_allclose(g, w, atol=5e-5, err_msg=f"{fn.__name__} {name}")
    # the sinks bind: the keys' weights sum to less than 1, so the output is not the plain softmax's
    plain = by_definition(q, k, v, jnp.full_like(sinks, -1e9), allowed, scale)
    assert float(jnp.abs(want - plain).max()) > 1e-2
