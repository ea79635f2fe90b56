"""Ring attention (Liu et al. 2023): attention over a sequence sharded along a mesh axis, the key/value shards
passed around the ring of devices with jax.lax.ppermute inside jax.shard_map while each device attends its queries
to the shard it holds, merging the partial results with the online softmax (as txjax.model.blockwise), here in its
logsumexp form: a (query chunk, key chunk) pair gives o_j = softmax_j(s) v_j and lse_j = log rowsum(e^s) (blockwise
attention's forward, in blocks), and
    lse' = log(e^lse + e^lse_j),   o' = e^(lse - lse') o + e^(lse_j - lse') o_j
After n steps (n devices on the axis) every query has seen every key, and no device held more than its shard of
keys and values at once. The backward pass (a custom VJP) goes around the ring once more: each pair's dq, dk, dv
by blockwise attention's backward from the final o and lse (Dao 2023, Algorithm 2: p = e^(s - lse) is the pair's
share of the whole softmax), dk and dv travelling with their key/value shard back to its device.

Load balance under a causal mask: the sequence is laid out zig-zag (`zigzag`): cut into 2n chunks, device i holds
chunks i and 2n-1-i, one early and one late, so that every device has as many (query chunk, key chunk) pairs below
the diagonal as any other. A pair with no allowed (query, key) is skipped by a lax.cond, so the devices do equal
work. Masks come from the segment ids and positions that travel with the keys (as blockwise.Segments), so any
layout of the sequence gives the same result. Memory per device: its shards of q, k, v, o and lse, one key/value
shard in flight, and a block x block matrix of scores per head.

In the model (mesh.sequence = n > 1) the zig-zag permutation happens once, at the input: `layout` reorders every
[B, L] array of the batch (tokens, targets, weights, positions, segment ids travel together) inside the jitted step,
so every activation stays in zig-zag order through all layers, the masks made from positions and segment ids stay
right, and the loss (a sum over tokens) is unchanged; the op itself never permutes. `attention` is the backend the
model's attention picks (attention.segment_backend) while the mesh in context (sharding.on_mesh) shards the sequence.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import einops
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from txjax.model import blockwise, score
from txjax.model.blockwise import Segments
from txjax.model.masks import NEG_INF
from txjax.parallel.sharding import BATCH_AXES, BATCH_LENGTH, SEQUENCE_AXIS, constrain, context_axis


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


def attention(
    q_BxLxHxK, k_BxSxGxK, v_BxSxGxK, segments, q_pos, k_pos, *, causal, heads_H, scale, block_q=256, softcap=0.0
):  # fmt: skip
    """blockwise.attention's contract on the mesh in context: rows over data x fsdp, the sequence over `sequence`,
    the heads over `tensor` where it divides them. segments: Segments or None (all attend). heads_H: the sinks
    (ALiBi's slopes refused); softcap: c > 0 caps each pair's scores (blockwise's, forward and backward)."""
    for name in set(heads_H) - {"sinks"}:
        raise ValueError(f"ring attention (mesh.sequence > 1) has no {score.RING_LACKS[name]}")
    b, l = q_BxLxHxK.shape[:2]
    if segments is None:
        segments = Segments(jnp.ones((b, l), jnp.int32), jnp.ones(k_BxSxGxK.shape[:2], jnp.int32))
    mesh = jax.sharding.get_abstract_mesh()
    tensor = dict(mesh.shape).get("tensor", 1)
    heads = "tensor" if q_BxLxHxK.shape[2] % tensor == 0 and k_BxSxGxK.shape[2] % tensor == 0 else None
    return ring_attention(
        q_BxLxHxK, k_BxSxGxK, v_BxSxGxK, segments.q, segments.k, q_pos, k_pos,
        mesh=mesh, batch_axes=BATCH_AXES, heads_axis=heads, causal=causal, scale=scale, block_q=block_q,
        softcap=softcap, sinks=heads_H.get("sinks"),
    )  # fmt: skip


def ring_attention(
    q, k, v, q_seg, k_seg, q_pos, k_pos, *, mesh, axis=SEQUENCE_AXIS, batch_axes=(), heads_axis=None, causal, scale,
    block_q=256, softcap=0.0, sinks=None,
):  # fmt: skip
    """softmax(mask(q k^T * scale)) v with the sequence (axis 1 of every argument) sharded over mesh axis `axis`,
    the rows over `batch_axes` and the heads over `heads_axis`: q [B, L, H, K], k/v [B, S, G, K] (H a multiple of
    G), segment ids and positions [B, L] / [B, S] (mask: the same nonzero segment, and key position <= query
    position when causal). Returns [B, L, H, K]. The sequence may be in any order (zigzag balances a causal mask).
    Each (query chunk, key chunk) pair runs as blockwise attention in blocks of block_q queries and keys.
    sinks [H] (float32, or None): a logit per head in the softmax's denominator, the merge's starting logsumexp (the
    sink's term is in the sum before any key's, as blockwise's online softmax starts from it)."""
    rows = batch_axes or None
    x4, x2 = P(rows, axis, heads_axis, None), P(rows, axis)
    sinks = jnp.full(q.shape[2], NEG_INF, jnp.float32) if sinks is None else sinks  # NEG_INF: no sink
    local = partial(_ring, _Ring(axis, mesh.shape[axis], causal, scale, block_q, softcap))
    in_specs = (x4, x4, x4, x2, x2, x2, x2, P(heads_axis))
    return jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=x4, check_vma=False)(
        q, k, v, q_seg, k_seg, q_pos, k_pos, sinks
    )


class _Ring(NamedTuple):  # static: the custom VJP's non-differentiable argument
    axis: str
    n: int
    causal: bool
    scale: float
    block: int
    softcap: float = 0.0

    def pair(self, chunk: int) -> blockwise.Plan:
        """blockwise's plan of one (query chunk, key chunk) pair: the causal order from positions only (the
        chunks are different stretches of the sequence), blocks of `block` where it divides the chunk."""
        size = self.block if chunk % self.block == 0 else chunk
        return blockwise.Plan(self.causal, self.scale, size, size, aligned=False, softcap=self.softcap)


def _chunks(plan: _Ring, t, pattern: str, **axes):
    """A shard's two zig-zag chunks (each skipped on its own), each in blockwise's layout [n, B, block, ...]."""
    size = plan.pair(t.shape[1] // 2).block_q
    return [einops.rearrange(c, pattern, q=size, **axes) for c in jnp.split(t, 2, axis=1)]


def _queries(plan: _Ring, q, q_seg, q_pos, g: int):
    """(q [n, B, bq, G, R, K], segment ids, positions [n, B, bq]) of each query chunk."""
    q_chunks = _chunks(plan, q, "b (n q) (g r) k -> n b q g r k", g=g)
    return list(zip(q_chunks, *(_chunks(plan, t, "b (n q) -> n b q") for t in (q_seg, q_pos))))


def _keys(plan: _Ring, k, v, k_seg, k_pos):
    """(k, v [n, B, bk, G, K], segment ids, positions [n, B, bk]) of each key chunk."""
    kv = (_chunks(plan, t, "b (n q) g k -> n b q g k") for t in (k, v))
    return list(zip(*kv, *(_chunks(plan, t, "b (n q) -> n b q") for t in (k_seg, k_pos))))


def _whole(chunks, pattern: str):
    """The inverse of _chunks: the chunks back in the shard's layout [B, L, ...]."""
    return jnp.concatenate([einops.rearrange(c, pattern) for c in chunks], axis=1)


def _meets(plan: _Ring, q_seg, q_pos, k_seg, k_pos):
    """False when no query of a chunk may attend to a key of the other (then the pair is skipped): no real token on
    a side, or under a causal mask every real key after every real query."""
    if not plan.causal:
        return (q_seg > 0).any() & (k_seg > 0).any()
    last_query = jnp.where(q_seg > 0, q_pos, -1).max()
    return jnp.where(k_seg > 0, k_pos, jnp.iinfo(jnp.int32).max).min() <= last_query


def _pass(plan: _Ring, arrays):
    """Each array one device along the ring (device i's to device i + 1)."""
    return tuple(jax.lax.ppermute(t, plan.axis, [(i, (i + 1) % plan.n) for i in range(plan.n)]) for t in arrays)


def _forward(plan: _Ring, q, k, v, q_seg, k_seg, q_pos, k_pos, sinks):
    """One device: its queries against each key/value shard in turn, the shards moving along the ring; per query
    chunk (o [n, B, bq, G, R, K] float32, logsumexp [n, B, G, R, bq]), merged pair by pair (the equation above),
    from o = 0 and lse = the head's sink (NEG_INF: none)."""
    g = k.shape[2]
    queries = _queries(plan, q, q_seg, q_pos, g)
    lse_shape = lambda qc: (qc.shape[0], qc.shape[1], g, qc.shape[4], qc.shape[2])
    sink_GxR = sinks.reshape(g, -1)[..., None]
    init = [(jnp.zeros(qc.shape, jnp.float32), jnp.broadcast_to(sink_GxR, lse_shape(qc))) for qc, _, _ in queries]

    def merge(state, qc, q_seg, q_pos, kc, vc, k_seg, k_pos):
        o, lse = state
        o_j, lse_j = blockwise.flash_forward(
            plan.pair(qc.shape[0] * qc.shape[2]), qc, kc, vc, q_seg, k_seg, q_pos, k_pos
        )
        new = jnp.logaddexp(lse, lse_j)
        weight = lambda t: einops.rearrange(jnp.exp(t - new), "n b g r q -> n b q g r 1")
        return o * weight(lse) + o_j.astype(jnp.float32) * weight(lse_j), new

    def step(carry, _):
        states, kv = carry
        new = []
        for (qc, q_seg, q_pos), state in zip(queries, states):
            for kc, vc, k_seg, k_pos in _keys(plan, *kv):
                met = _meets(plan, q_seg, q_pos, k_seg, k_pos)
                state = jax.lax.cond(met, merge, lambda s, *_: s, state, qc, q_seg, q_pos, kc, vc, k_seg, k_pos)
            new.append(state)
        return (new, _pass(plan, kv)), None

    return jax.lax.scan(step, (init, (k, v, k_seg, k_pos)), None, length=plan.n)[0][0]


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _ring(plan, q, k, v, q_seg, k_seg, q_pos, k_pos, sinks):
    return _ring_fwd(plan, q, k, v, q_seg, k_seg, q_pos, k_pos, sinks)[0]


def _ring_fwd(plan, q, k, v, q_seg, k_seg, q_pos, k_pos, sinks):
    states = _forward(plan, q, k, v, q_seg, k_seg, q_pos, k_pos, sinks)
    o = _whole([o for o, _ in states], "n b q g r k -> b (n q) (g r) k").astype(v.dtype)
    return o, (q, k, v, q_seg, k_seg, q_pos, k_pos, sinks, o, [lse for _, lse in states])


def _ring_bwd(plan, saved, do):
    """A second trip around the ring: each pair's dq, dk, dv by blockwise's backward from the final output and
    logsumexp (p = e^(s - lse) is the pair's share of the whole softmax); dk and dv travel with their key/value
    shard and are back on its device after n steps. The sinks' cotangent is this device's queries' share
    (score.head_grads); shard_map's transpose sums the devices' shares."""
    q, k, v, q_seg, k_seg, q_pos, k_pos, sinks, o, lses = saved
    g, f32 = k.shape[2], jnp.float32
    queries = _queries(plan, q, q_seg, q_pos, g)
    outs, grads = (_chunks(plan, t, "b (n q) (g r) k -> n b q g r k", g=g) for t in (o, do))

    def pair(acc, qc, q_seg, q_pos, o_c, lse, do_c, kc, vc, k_seg, k_pos):
        d = blockwise.flash_backward(
            plan.pair(qc.shape[0] * qc.shape[2]), qc, kc, vc, q_seg, k_seg, q_pos, k_pos, o_c, lse, do_c
        )
        return tuple(a + b.astype(f32) for a, b in zip(acc, d))

    def step(carry, _):
        dqs, (k, v, k_seg, k_pos, dk, dv) = carry
        keys = _keys(plan, k, v, k_seg, k_pos)
        dks, dvs = (list(t) for t in zip(*(c[:2] for c in _keys(plan, dk, dv, k_seg, k_pos))))
        new = []
        for (qc, q_seg, q_pos), o_c, lse, do_c, dq in zip(queries, outs, lses, grads, dqs):
            for j, (kc, vc, k_seg_j, k_pos_j) in enumerate(keys):
                met = _meets(plan, q_seg, q_pos, k_seg_j, k_pos_j)
                args = (qc, q_seg, q_pos, o_c, lse, do_c, kc, vc, k_seg_j, k_pos_j)
                dq, dks[j], dvs[j] = jax.lax.cond(met, pair, lambda a, *_: a, (dq, dks[j], dvs[j]), *args)
            new.append(dq)
        dk, dv = (_whole(t, "n b q g k -> b (n q) g k") for t in (dks, dvs))
        return (new, _pass(plan, (k, v, k_seg, k_pos, dk, dv))), None

    init = (
        [jnp.zeros(qc.shape, f32) for qc, _, _ in queries],
        (k, v, k_seg, k_pos, *(jnp.zeros(t.shape, f32) for t in (k, v))),
    )
    (dqs, (*_, dk, dv)), _ = jax.lax.scan(step, init, None, length=plan.n)
    dq = _whole(dqs, "n b q g r k -> b (n q) (g r) k")
    sink_GxR = sinks.reshape(g, -1)
    dsinks = sum(
        score.head_grads(
            {"sinks": sink_GxR},
            einops.rearrange(lse, "n b g r q -> n b q g r"),
            (do_c.astype(f32) * o_c.astype(f32)).sum(-1),
        )["sinks"]
        for o_c, lse, do_c in zip(outs, lses, grads)
    )
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, None, None, None, dsinks.reshape(-1)


_ring.defvjp(_ring_fwd, _ring_bwd)
