"""Sharding: a device mesh with named axes and the logical-axis rules that map the model onto it.

The model names every parameter axis logically ('embed', 'heads', 'mlp', ...; see models.py). The rules below
(MaxText / Flax lm1b style) map those names onto mesh axes:
  data    - batch rows (pure data parallelism; parameters replicated)
  fsdp    - batch rows too, and parameters/optimizer state sharded along 'embed' (ZeRO-3 / FSDP style)
  tensor  - attention heads, FFN hidden units and vocabulary (Megatron-style tensor parallelism)
XLA's SPMD partitioner inserts the collectives. An axis whose size does not divide by its mesh axes is replicated.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import numpy as np
import optax
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

LOGICAL_RULES = (
    ("batch", BATCH_AXES),
    ("embed", "fsdp"),
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("mlp", "tensor"),
    ("kv", None),
    ("layers", None),
    ("position", None),
)


def make_mesh(data: int = 1, fsdp: int = 1, tensor: int = 1, devices=None) -> Mesh:
    """A (data, fsdp, tensor) mesh over `devices` (default: all, across processes). Axes are Auto, so that
    with_sharding_constraint and jit shardings both work (jax.make_mesh defaults to Explicit axes)."""
    devices = jax.devices() if devices is None else devices
    shape = (data, fsdp, tensor)
    if math.prod(shape) != len(devices):
        raise ValueError(
            f"mesh data*fsdp*tensor = {'*'.join(map(str, shape))} = {math.prod(shape)} does not match "
            f"the {len(devices)} devices; set --config.mesh.data/fsdp/tensor so the product is "
            f"{len(devices)}"
        )
    return Mesh(np.asarray(devices).reshape(shape), MESH_AXES, axis_types=(AxisType.Auto,) * 3)


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
    """Batch rows split over data x fsdp; every other axis whole: P(('data', 'fsdp'))."""
    return NamedSharding(mesh, P(BATCH_AXES))


def global_batch(local_batch: dict, mesh: Mesh) -> dict:
    """Assemble the global batch from this process's rows (jax.make_array_from_process_local_data). With one
    process the local batch is the global one."""
    sharding = batch_sharding(mesh)
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, np.asarray(x)), local_batch)


def process_rows(mesh: Mesh, global_batch_size: int) -> slice:
    """The rows of every global batch that this process's devices hold (so the process builds only those):
    a contiguous slice, the whole batch when the batch axes do not cross processes."""
    index = batch_sharding(mesh).addressable_devices_indices_map((global_batch_size,))
    rows = [range(global_batch_size)[idx[0]] for idx in index.values()]
    return slice(min(r.start for r in rows), max(r.stop for r in rows))
