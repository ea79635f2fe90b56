"""Ring attention (Liu et al. 2023): attention over a sequence sharded along a mesh axis, the key/value shards
passed around the ring of devices with jax.lax.ppermute inside jax.shard_map while each device attends its queries
to the shard it holds, merging the partial results with the online softmax (as txjax.model.blockwise):
    m' = max(m, rowmax(s)),  l' = e^(m - m') l + rowsum(e^(s - m')),  o' = e^(m - m') o + e^(s - m') v
After n steps (n devices on the axis) every query has seen every key, and no device held more than its shard of
keys and values at once.

Load balance under a causal mask: the sequence is laid out zig-zag (`zigzag`): cut into 2n chunks, device i holds
chunks i and 2n-1-i, one early and one late, so that every device has as many (query chunk, key chunk) pairs below
the diagonal as any other. A pair with no allowed (query, key) is skipped by a lax.cond, so the devices do equal
work. Masks come from the segment ids and positions that travel with the keys (as blockwise.Segments), so any
layout of the sequence gives the same result. Gradients are jax's own through ppermute (its transpose sends the
cotangents back around the ring); each ring step is rematerialized in the backward pass.
"""

from __future__ import annotations

from functools import partial

import einops
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from txjax.model import precision

NEG_INF = -1e30  # as attention.NEG_INF


def zigzag(x, n: int, axis: int = 1):
    """The sequence axis reordered so that n equal shards hold chunks (i, 2n-1-i) of its 2n chunks, shard i-th."""
    order = [c for i in range(n) for c in (i, 2 * n - 1 - i)]
    chunks = jnp.split(x, 2 * n, axis=axis)
    return jnp.concatenate([chunks[c] for c in order], axis=axis)


def unzigzag(x, n: int, axis: int = 1):
    """The inverse of zigzag."""
    order = [c for i in range(n) for c in (i, 2 * n - 1 - i)]
    chunks = jnp.split(x, 2 * n, axis=axis)
    back = sorted(range(2 * n), key=lambda j: order[j])
    return jnp.concatenate([chunks[j] for j in back], axis=axis)


def ring_attention(q, k, v, q_seg, k_seg, q_pos, k_pos, *, mesh, axis="sequence", batch_axes=(), causal, scale):
    """softmax(mask(q k^T * scale)) v with the sequence (axis 1 of every argument) sharded over mesh axis `axis`
    and the rows over `batch_axes`: q [B, L, H, K], k/v [B, S, G, K] (H a multiple of G), segment ids and
    positions [B, L] / [B, S] (mask: the same nonzero segment, and key position <= query position when causal).
    Returns [B, L, H, K]. The sequence may be in any order (zigzag balances a causal mask)."""
    n = mesh.shape[axis]
    rows = batch_axes or None
    x4, x2 = P(rows, axis, None, None), P(rows, axis)
    local = partial(_ring, axis=axis, n=n, causal=causal, scale=scale)
    return jax.shard_map(local, mesh=mesh, in_specs=(x4, x4, x4, x2, x2, x2, x2), out_specs=x4, check_vma=False)(
        q, k, v, q_seg, k_seg, q_pos, k_pos
    )


def _ring(q, k, v, q_seg, k_seg, q_pos, k_pos, *, axis, n, causal, scale):
    """One device: its queries against each key/value shard in turn, the shards moving one device along the ring."""
    g = k.shape[2]
    q = einops.rearrange(q, "b l (g r) k -> b l g r k", g=g)
    halves = lambda t: jnp.split(t, 2, axis=1)  # the two zig-zag chunks of a shard, each skipped on its own
    qs, q_segs, q_poss = halves(q), halves(q_seg), halves(q_pos)
    shape = lambda qh: (qh.shape[0], g, qh.shape[3], qh.shape[1])  # [B, G, R, Lc]
    init = [(jnp.full(shape(qh), NEG_INF), jnp.zeros(shape(qh)), jnp.zeros((*shape(qh), v.shape[-1]))) for qh in qs]

    @jax.checkpoint
    def step(carry, _):
        states, kv = carry
        k, v, k_seg, k_pos = kv
        new = []
        for qh, sh, ph, state in zip(qs, q_segs, q_poss, states):
            for kh, vh, ksh, kph in zip(halves(k), halves(v), halves(k_seg), halves(k_pos)):
                ok = (sh[:, :, None] == ksh[:, None, :]) & (sh[:, :, None] > 0) & (ksh[:, None, :] > 0)
                if causal:
                    ok = ok & (kph[:, None, :] <= ph[:, :, None])
                state = jax.lax.cond(ok.any(), partial(_merge, scale=scale), lambda s, *_: s, state, qh, kh, vh, ok)
            new.append(state)
        kv = [jax.lax.ppermute(t, axis, [(i, (i + 1) % n) for i in range(n)]) for t in kv]
        return (new, kv), None

    (states, _), _ = jax.lax.scan(step, (init, [k, v, k_seg, k_pos]), None, length=n)
    outs = []
    for _, l, o in states:
        o = o / jnp.where(l > 0, l, 1.0)[..., None]  # no key to attend to: zeros, as the reference
        outs.append(einops.rearrange(o, "b g r q k -> b q (g r) k"))
    return jnp.concatenate(outs, axis=1).astype(v.dtype)


def _merge(state, q, k, v, ok, *, scale):
    """The online softmax's update by one (query chunk, key chunk) pair: q [B, Lc, G, R, K], k/v [B, Sc, G, K]."""
    m, l, o = state
    s = precision.einsum("bqgrk,bsgk->bgrqs", q, k, out_dtype=jnp.float32) * scale
    ok = ok[:, None, None]
    s = jnp.where(ok, s, NEG_INF)  # before exp: a masked score's exp(s - m) stays finite, so its gradient is 0, not NaN
    m_new = jax.lax.stop_gradient(jnp.maximum(m, s.max(-1)))  # the result does not depend on m
    p = jnp.where(ok, jnp.exp(s - m_new[..., None]), 0.0)
    correction = jnp.exp(m - m_new)
    pv = precision.einsum("bgrqs,bsgk->bgrqk", p.astype(v.dtype), v, out_dtype=jnp.float32)
    return m_new, correction * l + p.sum(-1), correction[..., None] * o + pv
