"""Sharding: a device mesh with named axes and the logical-axis rules that map the model onto it.

The model names every parameter axis logically ('embed', 'heads', 'mlp', ...; see models.py). The rules below
(MaxText / Flax lm1b style) map those names onto mesh axes:
  data    - batch rows (pure data parallelism; parameters replicated)
  fsdp    - batch rows too, and parameters/optimizer state sharded along 'embed' (ZeRO-3 / FSDP style)
  sequence - the length of the batch and of every activation (sequence parallelism): attention runs as ring
            attention over this axis (txjax.model.ring_attention), everything else is position-wise
  tensor  - attention heads, FFN hidden units and vocabulary (Megatron-style tensor parallelism)
  expert  - a mixture of experts' experts (expert parallelism, txjax.parallel.expert_parallel), and batch rows for
            everything else (as in GShard, DeepSpeed-MoE and MaxText: each device of an expert group holds different
            tokens, which all-to-all sends to the devices holding their experts)
XLA's SPMD partitioner inserts the collectives. An axis whose size does not divide by its mesh axes is replicated.
A jitted step traces under its mesh (`on_mesh`), so that the model reads the mesh in context (`context_axis`,
`constrain`) rather than taking it as an argument.
"""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import numpy as np
import optax
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

MESH_AXES = ("data", "fsdp", "expert", "sequence", "tensor")  # the batch axes first: a process's rows are contiguous
BATCH_AXES = ("data", "fsdp", "expert")
SEQUENCE_AXIS = "sequence"
EXPERT_AXIS = "expert"

LOGICAL_RULES = (
    ("batch", BATCH_AXES),
    ("embed", "fsdp"),
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("mlp", "tensor"),
    ("expert", EXPERT_AXIS),  # a mixture of experts' stacked expert weights (txjax.model.moe)
    ("kv", None),
    ("layers", None),
    ("position", None),
    ("length", SEQUENCE_AXIS),  # activations: [B, L] batch arrays and [B, L, D] hidden states
)
BATCH_LENGTH = ("batch", "length")


def make_mesh(data: int = 1, fsdp: int = 1, sequence: int = 1, tensor: int = 1, expert: int = 1, devices=None) -> Mesh:
    """A (data, fsdp, expert, sequence, tensor) mesh over `devices` (default: all, across processes), tensor the
    innermost (the axis with the most traffic on the nearest devices). Axes are Auto, so that with_sharding_constraint
    and jit shardings both work (jax.make_mesh defaults to Explicit axes)."""
    devices = jax.devices() if devices is None else devices
    sizes = {"data": data, "fsdp": fsdp, "expert": expert, "sequence": sequence, "tensor": tensor}
    if math.prod(sizes.values()) != len(devices):
        raise ValueError(
            f"mesh {'*'.join(sizes)} = {'*'.join(map(str, sizes.values()))} = {math.prod(sizes.values())} does not "
            f"match the {len(devices)} devices; set --config.mesh.{'/'.join(sizes)} so the product is {len(devices)}"
        )
    shape = tuple(sizes[axis] for axis in MESH_AXES)
    return Mesh(np.asarray(devices).reshape(shape), MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES))


def on_mesh(fn, mesh: Mesh):
    """fn traced under `mesh` (its abstract mesh in context: what `context_axis`, `constrain` and ring attention's
    shard_map read inside the jitted step)."""

    @functools.wraps(fn)
    def traced(*args, **kwargs):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            return fn(*args, **kwargs)

    return traced


def context_axis(name: str) -> int:
    """The size of axis `name` of the mesh in context (1 outside `on_mesh`, or where the mesh has no such axis)."""
    mesh = jax.sharding.get_abstract_mesh()
    return 1 if mesh.empty else dict(mesh.shape).get(name, 1)


def constrain(x, logical_axes: tuple):
    """x laid out by its logical axes (LOGICAL_RULES) on the mesh in context; unchanged outside `on_mesh`."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    spec = _fit(nn.logical_to_mesh_axes(logical_axes, LOGICAL_RULES), x.shape, mesh)
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


def _fit(spec: P, shape, mesh: Mesh) -> P:
    """Drop the mesh axes of any dimension they do not divide evenly (that dimension is then replicated)."""

    def size(axes):
        axes = (axes,) if isinstance(axes, str) else (axes or ())
        return math.prod(mesh.shape[a] for a in axes)

    return P(*(axes if dim % size(axes) == 0 else None for axes, dim in zip(spec, shape)))


def shardings_for(abstract_boxed, mesh: Mesh, rules=LOGICAL_RULES):
    """NamedShardings for a pytree whose leaves are logically partitioned (boxed) ShapeDtypeStructs, e.g.
    `jax.eval_shape` of a state built from `model.init` params and `tx.init` of them. Unboxed leaves (step
    counters, ...) are replicated; the placeholders of optax.partition's states for the parameters another
    transform takes (optax.MaskedNode, Muon's) stay as they are. Returns a tree with the unboxed structure."""
    specs = nn.logical_to_mesh(nn.get_partition_spec(abstract_boxed), rules)
    shapes = nn.meta.unbox(abstract_boxed)
    return jax.tree.map(
        lambda spec, s: s if isinstance(s, optax.MaskedNode) else NamedSharding(mesh, _fit(spec, s.shape, mesh)),
        specs,
        shapes,
        is_leaf=lambda x: isinstance(x, P),
    )


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """A batch array [B, L]: rows split over data x fsdp x expert, the length over sequence:
    P(('data', 'fsdp', 'expert'), 'sequence')."""
    return NamedSharding(mesh, nn.logical_to_mesh_axes(BATCH_LENGTH, LOGICAL_RULES))


def global_batch(local_batch: dict, mesh: Mesh) -> dict:
    """Assemble the global batch from this process's rows (jax.make_array_from_process_local_data): whole rows, so
    that where the sequence axis crosses processes each device reads its stretch of them. With one process the
    local batch is the global one."""
    sharding, shards = batch_sharding(mesh), math.prod(mesh.shape[a] for a in BATCH_AXES)
    index = NamedSharding(mesh, P(BATCH_AXES)).addressable_devices_indices_map((shards,))
    mine = len({idx[0].start for idx in index.values()})  # the row shards this process holds

    def one(x):
        x = np.asarray(x)
        return jax.make_array_from_process_local_data(sharding, x, (x.shape[0] * shards // mine, *x.shape[1:]))

    return jax.tree.map(one, local_batch)


def process_rows(mesh: Mesh, global_batch_size: int) -> slice:
    """The rows of every global batch that this process's devices hold (so the process builds only those):
    a contiguous slice, the whole batch when the batch axes do not cross processes."""
    index = NamedSharding(mesh, P(BATCH_AXES)).addressable_devices_indices_map((global_batch_size,))
    rows = [range(global_batch_size)[idx[0]] for idx in index.values()]
    return slice(min(r.start for r in rows), max(r.stop for r in rows))
