"""Each parameter's role, declared where the module creates it: what the optimizer needs to know of a parameter
(weight decay, Muon or AdamW, muP's learning-rate multiplier) read from the parameter itself, never from its name.

    matrix     a weight matrix inside the layers (attention's W^Q, W^K, W^V, W^O, the FFN's and the experts' weights,
               the router): decayed; Muon orthogonalizes it over its `inputs` x `outputs` trailing axes (a scanned
               layer axis or an expert axis in front is a batch axis); muP's hidden weights (lr / m)
    embedding  token and position embeddings, T5's relative-bias table: decayed; AdamW under Muon; muP lr 1
    head       the untied LM head (the readout): as an embedding
    norm       a norm's gain or offset: not decayed (as nanoGPT); plain Adam under Muon; muP lr 1
    bias       an additive bias (projections', the router's, the logits'): as a norm's gain

A module creates a parameter with `init(initializer, logical_axes, ROLE)` in place of flax's
`nn.with_logical_partitioning` (the same box, logical axes and sharding rules, with the role beside them);
`param_roles` of a model (txjax.families) reads them all, and refuses a parameter created without one.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
from flax import struct

ROLE_KINDS = ("matrix", "embedding", "head", "norm", "bias")


@dataclasses.dataclass(frozen=True)
class Role:
    kind: str
    inputs: int = 1  # a matrix's trailing axes that its product contracts (W^O [H, K, D]: 2)
    outputs: int = 1  # and that it produces (W^Q [D, H, K]: 2)

    def __post_init__(self):
        if self.kind not in ROLE_KINDS:
            raise ValueError(f"parameter role {self.kind!r} is not one of {', '.join(ROLE_KINDS)}")

    @property
    def decayed(self) -> bool:
        """Weight decay applies: matrices, embeddings and the head; not norms' gains and biases."""
        return self.kind in ("matrix", "embedding", "head")

    @property
    def hidden(self) -> bool:
        """A hidden weight matrix: muP's 1/m learning rate, Muon's orthogonalized update."""
        return self.kind == "matrix"


MATRIX, EMBEDDING, HEAD, NORM, BIAS = (Role(kind) for kind in ROLE_KINDS)
QKV = Role("matrix", inputs=1, outputs=2)  # [D, heads, K]
OUT = Role("matrix", inputs=2, outputs=1)  # [H, K, D]


class RoledParam(nn.LogicallyPartitioned):
    """flax's logically partitioned box with the parameter's role (kept through nn.scan's added layer axis)."""

    role: Role | None = struct.field(default=None, pytree_node=False)


def init(initializer, names: tuple, role: Role):
    """`initializer` whose value is boxed with its logical axis `names` and its `role`."""

    def boxed(*args, **kwargs):
        return RoledParam(initializer(*args, **kwargs), tuple(names), role=role)

    return boxed


def roles_of(boxed_params):
    """The tree of Roles of a boxed parameter tree (as init_params(..., boxed=True) gives, or its eval_shape), with
    the unboxed tree's structure; a parameter created without a role is refused, by its path."""

    def role(path, leaf):
        if not isinstance(leaf, RoledParam) or leaf.role is None:
            raise ValueError(
                f"parameter {jax.tree_util.keystr(path)} has no role: create it with txjax.model.roles.init"
            )
        return leaf.role

    return jax.tree_util.tree_map_with_path(role, boxed_params, is_leaf=lambda x: isinstance(x, nn.meta.AxisMetadata))
