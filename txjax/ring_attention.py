"""Ring attention (Liu et al. 2023): attention over a sequence sharded along a mesh axis, the key/value shards
passed around the ring of devices with jax.lax.ppermute inside jax.shard_map while each device attends its queries
to the shard it holds, merging the partial results with the online softmax (as txjax.blockwise):
    m' = max(m, rowmax(s)),  l' = e^(m - m') l + rowsum(e^(s - m')),  o' = e^(m - m') o + e^(s - m') v
After n steps (n devices on the axis) every query has seen every key, and no device held more than its shard of
keys and values at once.

Load balance under a causal mask: the sequence is laid out zig-zag (`zigzag`): cut into 2n chunks, device i holds
chunks i and 2n-1-i, one early and one late, so that every device has as many (query chunk, key chunk) pairs below
the diagonal as any other. A pair with no allowed (query, key) is skipped by a lax.cond, so the devices do equal
work. Masks come from the segment ids and positions that travel with the keys (as blockwise.Segments), so any
layout of the sequence gives the same result. Gradients are jax's own through ppermute (its transpose sends the
cotangents back around the ring); each ring step is rematerialized in the backward pass.

In the model (mesh.sequence = n > 1) the zig-zag permutation happens once, at the input: `layout` reorders every
[B, L] array of the batch (tokens, targets, weights, positions, segment ids travel together) inside the jitted step,
so every activation stays in zig-zag order through all layers, the masks made from positions and segment ids stay
right, and the loss (a sum over tokens) is unchanged; the op itself never permutes. `attention` is the backend the
model's attention picks (attention.segment_backend) while the mesh in context (sharding.on_mesh) shards the sequence.
"""

from __future__ import annotations

from functools import partial

import einops
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from txjax import precision
from txjax.blockwise import Segments
from txjax.sharding import BATCH_AXES, BATCH_LENGTH, SEQUENCE_AXIS, constrain, context_axis

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


def serves() -> bool:
    """Whether the mesh in context shards the sequence (a step traced by sharding.on_mesh with mesh.sequence > 1)."""
    return context_axis(SEQUENCE_AXIS) > 1


def layout(batch: dict) -> dict:
    """The batch's [B, L] arrays in zig-zag order, laid out along the sequence axis, when the mesh in context shards
    the sequence (n > 1: L must be a multiple of 2n); the batch as it is otherwise."""
    n = context_axis(SEQUENCE_AXIS)
    if n == 1:
        return batch
    for key, x in batch.items():
        if x.shape[1] % (2 * n):
            raise ValueError(f"batch {key!r} of length {x.shape[1]} does not split into 2 * mesh.sequence = {2 * n}")
    return {key: constrain(zigzag(x, n), BATCH_LENGTH) for key, x in batch.items()}


def attention(q_BxLxHxK, k_BxSxGxK, v_BxSxGxK, segments, q_pos, k_pos, *, causal, slopes_H, scale, block_q=256):
    """blockwise.attention's contract on the mesh in context: rows over data x fsdp, the sequence over `sequence`,
    the heads over `tensor` where it divides them. segments: Segments or None (all attend). No ALiBi (slopes_H)."""
    if slopes_H is not None:
        raise ValueError("ring attention (mesh.sequence > 1) has no ALiBi bias: use another model.positional")
    b, l = q_BxLxHxK.shape[:2]
    if segments is None:
        segments = Segments(jnp.ones((b, l), jnp.int32), jnp.ones(k_BxSxGxK.shape[:2], jnp.int32))
    mesh = jax.sharding.get_abstract_mesh()
    tensor = dict(mesh.shape).get("tensor", 1)
    heads = "tensor" if q_BxLxHxK.shape[2] % tensor == 0 and k_BxSxGxK.shape[2] % tensor == 0 else None
    return ring_attention(
        q_BxLxHxK, k_BxSxGxK, v_BxSxGxK, segments.q, segments.k, q_pos, k_pos,
        mesh=mesh, batch_axes=BATCH_AXES, heads_axis=heads, causal=causal, scale=scale, block_q=block_q,
    )  # fmt: skip


def ring_attention(
    q, k, v, q_seg, k_seg, q_pos, k_pos, *, mesh, axis=SEQUENCE_AXIS, batch_axes=(), heads_axis=None, causal, scale,
    block_q=256,
):  # fmt: skip
    """softmax(mask(q k^T * scale)) v with the sequence (axis 1 of every argument) sharded over mesh axis `axis`,
    the rows over `batch_axes` and the heads over `heads_axis`: q [B, L, H, K], k/v [B, S, G, K] (H a multiple of
    G), segment ids and positions [B, L] / [B, S] (mask: the same nonzero segment, and key position <= query
    position when causal). Returns [B, L, H, K]. The sequence may be in any order (zigzag balances a causal mask).
    Each (query chunk, key chunk) pair is computed block_q queries at a time (`_merge`)."""
    n = mesh.shape[axis]
    rows = batch_axes or None
    x4, x2 = P(rows, axis, heads_axis, None), P(rows, axis)
    local = partial(_ring, axis=axis, n=n, causal=causal, merge=partial(_merge, scale=scale, block=block_q))
    return jax.shard_map(local, mesh=mesh, in_specs=(x4, x4, x4, x2, x2, x2, x2), out_specs=x4, check_vma=False)(
        q, k, v, q_seg, k_seg, q_pos, k_pos
    )


def _ring(q, k, v, q_seg, k_seg, q_pos, k_pos, *, axis, n, causal, merge):
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
                state = jax.lax.cond(ok.any(), merge, lambda s, *_: s, state, qh, kh, vh, ok)
            new.append(state)
        kv = [jax.lax.ppermute(t, axis, [(i, (i + 1) % n) for i in range(n)]) for t in kv]
        return (new, kv), None

    (states, _), _ = jax.lax.scan(step, (init, [k, v, k_seg, k_pos]), None, length=n)
    outs = []
    for _, l, o in states:
        o = o / jnp.where(l > 0, l, 1.0)[..., None]  # no key to attend to: zeros, as the reference
        outs.append(einops.rearrange(o, "b g r q k -> b q (g r) k"))
    return jnp.concatenate(outs, axis=1).astype(v.dtype)


def _merge(state, q, k, v, ok, *, scale, block):
    """The online softmax's update by one (query chunk, key chunk) pair: q [B, Lc, G, R, K], k/v [B, Sc, G, K], ok
    [B, Lc, Sc]; queries and keys in blocks of `block` (where it divides Lc, Sc): a lax.map over the query blocks of
    a lax.scan over the key blocks, both rematerialized in the backward pass, so that no more than block x block
    scores per head live at once."""

    def blocks(t, axis, size):  # [.., size * nb, ..] -> [nb, .., size, ..] (one block unless size divides it)
        size = size if t.shape[axis] % size == 0 else t.shape[axis]
        return jnp.moveaxis(t.reshape(*t.shape[:axis], -1, size, *t.shape[axis + 1 :]), axis, 0)

    def whole(t, axis):  # the inverse of blocks
        t = jnp.moveaxis(t, 0, axis)
        return t.reshape(*t.shape[:axis], -1, *t.shape[axis + 2 :])

    @jax.checkpoint
    def query_block(xs):
        m, l, o, q, ok = xs
        update = jax.checkpoint(lambda state, ys: (_merge_block(*state, q, *ys, scale=scale), None))
        return jax.lax.scan(update, (m, l, o), (blocks(k, 1, block), blocks(v, 1, block), blocks(ok, 2, block)))[0]

    qs = (*(blocks(t, 3, block) for t in state), blocks(q, 1, block), blocks(ok, 1, block))
    return tuple(whole(t, 3) for t in jax.lax.map(query_block, qs))


def _merge_block(m, l, o, q, k, v, ok, *, scale):
    """The online softmax's update of one block pair: m, l [B, G, R, Lb], o [B, G, R, Lb, K], q [B, Lb, G, R, K],
    k/v [B, Sb, G, K], ok [B, Lb, Sb]."""
    s = precision.einsum("bqgrk,bsgk->bgrqs", q, k, out_dtype=jnp.float32) * scale
    ok = ok[:, None, None]
    s = jnp.where(ok, s, NEG_INF)  # before exp: a masked score's exp(s - m) stays finite, so its gradient is 0, not NaN
    m_new = jax.lax.stop_gradient(jnp.maximum(m, s.max(-1)))  # the result does not depend on m
    p = jnp.where(ok, jnp.exp(s - m_new[..., None]), 0.0)
    correction = jnp.exp(m - m_new)
    pv = precision.einsum("bgrqs,bsgk->bgrqk", p.astype(v.dtype), v, out_dtype=jnp.float32)
    return m_new, correction * l + p.sum(-1), correction[..., None] * o + pv
