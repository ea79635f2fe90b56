"""Expert parallelism: a mixture of experts' X experts split over the E devices of the `expert` mesh axis (X/E each),
tokens sent to the devices holding their experts by all-to-all (GShard, Lepikhin et al. 2021; DeepSpeed-MoE).

The expert axis is a batch axis for everything else (sharding.BATCH_AXES): each device of an expert group holds
its own tokens and routes them itself (txjax.model.moe). Per MoE layer, inside jax.shard_map over the whole mesh:
    sort the device's A = m k assignments by expert; destination d holds experts [d X/E, (d+1) X/E)
    to[d]   = the rows for destination d, then zeros      [E, A, D]: A rows per destination, the most it can get
    from    = all_to_all(to)                              from[s]: the rows device s sent here, sorted by expert
    out     = this device's X/E experts on from's E A rows (one grouped matmul; the zero rows belong to none)
    back    = all_to_all(out)                             back[d]: what destination d computed of the rows sent
    y       = send^T(back)                                each row's output in the sorted order (send is a partial
                                                          permutation: its transpose puts every row back)
and the group sizes per expert travel the same way (all_to_all of [E, X/E] counts). Nothing is dropped: the
buffers hold every assignment even if all go to one device, so they hold E times the rows of a ragged exchange
(jax.lax.ragged_all_to_all would send only the rows; XLA:CPU, where the tests run, has no kernel for it).

Why shard_map rather than sharding annotations on the one-device code: that code sorts all M k assignments of the
global batch with one argsort and gathers them by it; from annotations alone XLA's SPMD partitioner does not turn a
global sort-and-gather into an exchange between expert shards. It all-gathers the rows and the expert weights
instead (benchmarks/expert_parallel_hlo.py counts the collectives of both programs; the annotated one on the mesh
(expert=4) has all-gathers and no all-to-all).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from txjax.parallel.sharding import BATCH_AXES, EXPERT_AXIS, SEQUENCE_AXIS, context_axis


def applies(shape_BxL, num_experts: int) -> bool:
    """Whether the mesh in context splits the experts (expert axis > 1, dividing them) and the rows and the length of
    a [B, L, ...] activation divide over their axes; otherwise the one-device code runs, laid out by XLA."""
    e = context_axis(EXPERT_AXIS)
    if e == 1 or num_experts % e:
        return False
    b, l = shape_BxL[:2]
    return b % math.prod(context_axis(axis) for axis in BATCH_AXES) == 0 and l % context_axis(SEQUENCE_AXIS) == 0


def on_expert_shards(body, weights, x_BxLxD, group_BxLxJ):
    """body(this device's expert weights [X/E, ...], its tokens [b, l, D], their experts [b, l, J]) -> [J, b, l, D]
    on every device of the mesh in context (jax.shard_map): the weights split along their first (expert) axis and
    gathered along every other (each device holds its experts whole), the tokens by rows and length."""
    tokens = P(BATCH_AXES, SEQUENCE_AXIS, None)
    return jax.shard_map(
        body,
        mesh=jax.sharding.get_abstract_mesh(),
        in_specs=(P(EXPERT_AXIS), tokens, tokens),
        out_specs=P(None, BATCH_AXES, SEQUENCE_AXIS, None),
    )(weights, x_BxLxD, group_BxLxJ)


def exchange(local_experts, sorted_AxD, sizes_X):
    """Inside on_expert_shards: the outputs [A, D] of this device's assignments sorted by expert (sizes_X: how many
    of them each of the X experts takes; rows past their sum give 0), computed on the devices holding their experts.
    local_experts(rows [R, D], expert of each [R] in [0, X/E], X/E: none) -> [R, D] runs there."""
    e = context_axis(EXPERT_AXIS)
    a = sorted_AxD.shape[0]
    sizes_ExL = sizes_X.reshape(e, -1)  # destination d's experts' sizes
    rows_E = sizes_ExL.sum(1)
    starts_E = jnp.cumsum(rows_E) - rows_E
    valid_ExA = jnp.arange(a) < rows_E[:, None]

    def send(rows_AxD):
        padded = jnp.concatenate([rows_AxD, jnp.zeros(rows_AxD.shape, rows_AxD.dtype)])  # any start + A in range
        to_ExAxD = jnp.stack([jax.lax.dynamic_slice_in_dim(padded, starts_E[d], a) for d in range(e)])
        return jnp.where(valid_ExA[..., None], to_ExAxD, jnp.zeros((), rows_AxD.dtype))

    def all_to_all(x):
        return jax.lax.all_to_all(x, EXPERT_AXIS, 0, 0, tiled=True)

    from_ExAxD, got_ExL = all_to_all(send(sorted_AxD)), all_to_all(sizes_ExL)
    expert_ExA = jax.vmap(lambda sizes: jnp.searchsorted(jnp.cumsum(sizes), jnp.arange(a), side="right"))(got_ExL)
    out_ExAxD = local_experts(from_ExAxD.reshape(e * a, -1), expert_ExA.reshape(-1)).reshape(e, a, -1)
    (y_AxD,) = jax.linear_transpose(send, sorted_AxD)(all_to_all(out_ExAxD).astype(sorted_AxD.dtype))
    return y_AxD
