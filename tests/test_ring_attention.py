"""Ring attention over 4 and 8 simulated CPU devices (tests/conftest.py asks XLA for 8): outputs and gradients equal
the one-device reference attention, the sequence sharded zig-zag over a `sequence` mesh axis, rows over data x fsdp;
with a score soft cap, and with attention sinks (their gradient too)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

from txjax.model import masks
from txjax.model.ring_attention import ring_attention, unzigzag, zigzag

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 devices (XLA_FLAGS set in conftest.py)")
B, L, H, G, K = 2, 32, 4, 2, 8


def test_zigzag_gives_shard_i_chunks_i_and_its_mirror():
    x = jnp.arange(16)[None]
    np.testing.assert_array_equal(zigzag(x, 4)[0], [0, 1, 14, 15, 2, 3, 12, 13, 4, 5, 10, 11, 6, 7, 8, 9])
    np.testing.assert_array_equal(unzigzag(zigzag(x, 4), 4), x)


@pytest.mark.parametrize(  # (data, fsdp, sequence); a soft cap that binds (the scores reach ~3); sinks (GPT-OSS's)
    "mesh_shape, softcap, sinks",
    [
        ((1, 1, 4), 0.0, False),
        ((1, 2, 4), 0.0, True),
        ((2, 1, 4), 0.0, False),
        ((1, 1, 8), 0.0, True),
        ((1, 1, 4), 0.5, False),
    ],
)
def test_ring_attention_equals_the_reference(mesh_shape, softcap, sinks):
    rng = np.random.default_rng(0)
    q, w = (jnp.asarray(rng.normal(size=(B, L, H, K)), jnp.float32) for _ in range(2))
    k, v = (jnp.asarray(rng.normal(size=(B, L, G, K)), jnp.float32) for _ in range(2))
    seg = jnp.asarray([[1] * 20 + [2] * 9 + [0] * 3, [1] * 32], jnp.int32)  # packed, padded; one segment
    pos = jnp.asarray([list(range(20)) + list(range(9)) + [0] * 3, list(range(32))], jnp.int32)

    sink_H = jnp.asarray(rng.normal(size=H), jnp.float32) if sinks else None

    def reference(q, k, v, sink_H):
        mask = masks.segment_mask(seg, seg) & masks.causal_mask(pos, pos)
        heads = lambda t: jnp.repeat(t, H // G, axis=2).transpose(0, 2, 1, 3)
        s = jnp.einsum("bhlk,bhsk->bhls", q.transpose(0, 2, 1, 3), heads(k)) * K**-0.5
        s = softcap * jnp.tanh(s / softcap) if softcap else s
        s = jnp.where(mask, s, -1e30)  # mask [B, 1, L, S]
        if sink_H is not None:  # softmax over [scores, sink], the sink's column dropped
            s = jnp.concatenate([s, jnp.broadcast_to(sink_H[None, :, None, None], (*s.shape[:3], 1))], -1)
        p = jnp.where(mask, jax.nn.softmax(s, -1)[..., : heads(v).shape[2]], 0.0)  # a padding row: zeros
        return jnp.einsum("bhls,bhsk->blhk", p, heads(v))

    n = mesh_shape[2]
    mesh = Mesh(np.asarray(jax.devices()[: np.prod(mesh_shape)]).reshape(mesh_shape), ("data", "fsdp", "sequence"))

    def ring(q, k, v, sink_H):
        z = lambda t: zigzag(t, n)
        kw = dict(mesh=mesh, batch_axes=("data", "fsdp"), causal=True, scale=K**-0.5, block_q=2, softcap=softcap)
        return unzigzag(ring_attention(z(q), z(k), z(v), z(seg), z(seg), z(pos), z(pos), sinks=sink_H, **kw), n)

    loss = lambda f: lambda *a: (f(*a) * w).sum()
    args, wrt = (q, k, v, sink_H), (0, 1, 2, 3) if sinks else (0, 1, 2)
    expected = (reference(*args), *jax.grad(loss(reference), argnums=wrt)(*args))
    got = (jax.jit(ring)(*args), *jax.jit(jax.grad(loss(ring), argnums=wrt))(*args))
    for name, g, e in zip(("out", "dq", "dk", "dv", "dsinks"), got, expected):
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-5, atol=1e-5, err_msg=name)
