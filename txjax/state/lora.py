"""LoRA (Hu et al. 2021): low-rank adapters beside a model's weight matrices, the base weights frozen.

A targeted weight W, of role matrix (txjax.model.roles) with `inputs` x `outputs` trailing axes and any axes in
front (a scanned layer axis, the experts') as batch axes, gets A [..., I, r] ~ N(0, 1/r^2) (peft's
init_lora_weights="gaussian") and B [..., r, O] = 0, I and O the products of its input and output axes; the model
runs on the merged weights

    W' = W + A (s B) (reshaped as W),  s = alpha / r  (rsLoRA, train.lora_scaling="rslora": alpha / sqrt(r))

so B = 0 at step 0 gives the base's forward pass exactly. DoRA (Liu et al. 2024, peft's use_dora; train.lora_variant
= "dora") adds a trained magnitude m [..., O], one value per output feature, initialised to W's norm over its inputs:

    W' = m * V / ||V||,  V = W + A (s B),  the norm ||V|| per output over the input axes, held out of the gradient,

(txjax.model.adapters.merge), so step 0 is the base again (to rounding: ||W|| / ||W||). The state's parameters are
then `Adapted(base, lora)`: the train step (txjax.training.step) differentiates the objective with respect to `lora`
alone, `base` being an argument it does not differentiate, and the optimizer's state is built over `lora` alone (its
roles: `trained_roles`), so no gradient tree nor moment of the base is kept. The train step applies the model to the
base and the adapters (`base_and_adapters`), and each block merges its own weights as it runs
(txjax.model.adapters): the full-size W' and its gradient are one block's at a time. Everything that reads a
checkpoint's parameters (evaluation, generation, export) reads `model_params`: the whole tree merged by the same
function, so that generating from a LoRA run is generating from its merged export.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import traverse_util

from txjax.errors import ConfigError
from txjax.fields import Range, ReadBy, at_least, setting
from txjax.model import adapters
from txjax.model.roles import Role

# the weight matrices LoRA may adapt, by their parameter names (attention's in self- and cross-attention; the FFN's
# in a dense FFN, an MoE's experts and its shared experts); the default: all of them but the router
TARGETS = ("query", "key", "value", "out", "wi", "wi_gate", "wo", "router")
_ON = ReadBy("train.lora_rank", lambda r: r > 0, "LoRA is off (train.lora_rank=0)")
_ADAPTER = Role("matrix")  # A [..., I, r] and B [..., r, O]: matrices over their last two axes (Muon, muP)
_MAGNITUDE = Role("norm")  # DoRA's m [..., O]: a gain per output, as a norm's (not decayed, Adam under Muon, muP 1)


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """config.train's LoRA settings (their schema: txjax.fields); rank 0: every parameter trains."""

    lora_rank: int = setting(0, bounds=at_least(0, " (0 = off)"), resume=False)
    lora_alpha: float = setting(16.0, bounds=Range(lambda v: v > 0, "> 0"), resume=False, read_by=(_ON,))
    lora_scaling: str = setting("lora", choices=("lora", "rslora"), resume=False, read_by=(_ON,))
    lora_targets: tuple[str, ...] = setting(TARGETS[:-1], resume=False, read_by=(_ON,))
    # "dora": each adapted weight's magnitude trained beside A and B (peft's use_dora); a choice of kinds, as
    # lora_scaling, so that another variant is one more name
    lora_variant: str = setting("lora", choices=("lora", "dora"), resume=False, read_by=(_ON,))
    # peft's lora_dropout: y = x W + s drop(x) A B in training (txjax.model.adapters), attention's and dense FFNs'
    lora_dropout: float = setting(0.0, bounds=Range(lambda v: 0 <= v < 1, "in [0, 1)"), read_by=(_ON,))

    @classmethod
    def of(cls, t) -> LoraConfig:
        """From a validated config.train section (its list of targets a tuple)."""
        return cls(**{f.name: t[f.name] for f in dataclasses.fields(cls)} | {"lora_targets": tuple(t.lora_targets)})

    @property
    def scale(self) -> float:
        r = self.lora_rank
        return self.lora_alpha / (math.sqrt(r) if self.lora_scaling == "rslora" else r)


@flax.struct.dataclass
class Adapted:
    """A LoRA run's parameters: the frozen `base` (the model's tree) and the trained `lora` ({path...: {"a", "b"}},
    DoRA's {"a", "b", "m"}, the base's nesting, targeted weights only), merged with `scale`."""

    base: Any
    lora: Any
    scale: float = flax.struct.field(pytree_node=False)


def check_targets(targets) -> None:
    """train.lora_targets: names of TARGETS, at least one, none twice (ConfigError, one line)."""
    unknown = [name for name in targets if name not in TARGETS]
    if unknown or not targets or len(set(targets)) != len(targets):
        problem = f"unknown {', '.join(map(repr, unknown))}" if unknown else "empty or a name repeated"
        raise ConfigError(
            f"config.train.lora_targets={list(targets)!r}: {problem}; LoRA adapts the weight matrices "
            f"{', '.join(TARGETS)}, e.g. --config.train.lora_targets=query,value"
        )


def weight_name(path: tuple) -> str:
    """A parameter's name: nn.Dense's module name for its 'kernel', else its own."""
    return path[-2] if path[-1] == "kernel" else path[-1]


def targeted(roles, lora: LoraConfig) -> dict[tuple, Role]:
    """{path: role} of the weights `lora` adapts in a model of `roles` (txjax.families.param_roles); ConfigError
    when its targets name none of them, or its rank is above a weight's smaller dimension (its rank at most)."""
    flat = traverse_util.flatten_dict(roles)
    found = {
        path: role for path, role in flat.items() if weight_name(path) in lora.lora_targets and role.kind == "matrix"
    }
    if not found:
        have = sorted({weight_name(path) for path, role in flat.items() if role.kind == "matrix"})
        raise ConfigError(
            f"config.train.lora_targets={list(lora.lora_targets)!r} names no weight matrix of this model; its "
            f"matrices: {', '.join(have)}"
        )
    if lora.lora_dropout and lora.lora_variant == "dora":
        raise ConfigError(
            f"config.train.lora_dropout={lora.lora_dropout} is not implemented with train.lora_variant=dora (its "
            "merged weight has no dropped-out term): set train.lora_dropout=0 or train.lora_variant=lora"
        )
    if lora.lora_dropout and (odd := sorted("/".join(path) for path in found if not _drops_out(path))):
        raise ConfigError(
            f"config.train.lora_dropout={lora.lora_dropout} drops out the inputs of attention's and dense FFNs' "
            f"adapters, not of {odd[0]} ({len(odd)} weights in all): set train.lora_dropout=0 or "
            "train.lora_targets to those weights"
        )
    return found


def _drops_out(path: tuple) -> bool:
    """Whether the weight at `path` is one whose projection adds a dropped-out low-rank term (txjax.model.adapters):
    attention's (txjax.model.multi_head) or a dense FFN's nn.Dense kernel (txjax.model.ffn)."""
    attention = path[-2] in ("self_attention", "cross_attention") and path[-1] in ("query", "key", "value", "out")
    return attention or (path[-1] == "kernel" and path[-2] in ("wi", "wi_gate", "wo"))


def adapted(params, roles, lora: LoraConfig, key) -> Adapted:
    """`params` as the base of a LoRA run, each targeted weight's A drawn from `key` (folded with its index), B 0;
    DoRA's m W's norm over its inputs for each output."""
    flat, out = traverse_util.flatten_dict(params), {}
    for i, (path, role) in enumerate(sorted(targeted(roles, lora).items())):
        w = nn.meta.unbox(flat[path])  # a boxed tree's (state_shardings') weight: its shape
        batch, (inputs, outputs) = w.shape[: w.ndim - role.inputs - role.outputs], matrix_sizes(w.shape, role)
        if lora.lora_rank > min(inputs, outputs):
            raise ConfigError(
                f"config.train.lora_rank={lora.lora_rank} is above the dimension of {'/'.join(path)} "
                f"({inputs} x {outputs}): set train.lora_rank <= {min(inputs, outputs)}"
            )
        a = jax.random.normal(jax.random.fold_in(key, i), (*batch, inputs, lora.lora_rank), w.dtype)
        b = jnp.zeros((*batch, lora.lora_rank, outputs), w.dtype)
        out[(*path, "a")], out[(*path, "b")] = boxed_like(flat[path], role, a / lora.lora_rank, b)
        if lora.lora_variant == "dora":
            m = adapters.norms(w.reshape(*batch, inputs, outputs)).astype(w.dtype)
            out[(*path, "m")] = magnitude_like(flat[path], role, m)
    return Adapted(params, traverse_util.unflatten_dict(out), lora.scale)


def boxed_like(w, role: Role, a, b) -> tuple:
    """(A, B) boxed as their weight `w` is (a boxed tree's, as state_shardings reads it), so that on a mesh they and
    their moments lie with it: A [..., I, r] on W's leading and input axes, B [..., r, O] on its leading and output
    axes, r on none. A flattened group (W^Q's output heads x kv) is named by its first axis: its split is then the
    group's while the others (kv) are not split, as sharding.LOGICAL_RULES has them. Unboxed `w`: (A, B) as they are."""
    if not isinstance(w, nn.LogicallyPartitioned):
        return a, b
    lead = len(w.names) - role.inputs - role.outputs
    first_input, first_output = w.names[lead], w.names[len(w.names) - role.outputs]
    return (
        w.replace(value=a, names=(*w.names[:lead], first_input, None), role=_ADAPTER),
        w.replace(value=b, names=(*w.names[:lead], None, first_output), role=_ADAPTER),
    )


def magnitude_like(w, role: Role, m):
    """DoRA's m [..., O] boxed as its weight `w` is: on W's leading axes and the first of its outputs (as B's)."""
    if not isinstance(w, nn.LogicallyPartitioned):
        return m
    lead = len(w.names) - role.inputs - role.outputs
    return w.replace(value=m, names=(*w.names[:lead], w.names[len(w.names) - role.outputs]), role=_MAGNITUDE)


def matrix_sizes(shape: tuple, role: Role) -> tuple[int, int]:
    """(I, O): the products of a weight's input and output axes."""
    return math.prod(shape[len(shape) - role.inputs - role.outputs : len(shape) - role.outputs]), math.prod(
        shape[len(shape) - role.outputs :]
    )


def base_and_adapters(params):
    """(the parameters the model is applied to, the adapters it merges block by block: {"a": A, "b": s B} at each
    adapted weight, DoRA's with its "m", txjax.model.adapters); any other run's (params, None)."""
    if not isinstance(params, Adapted):
        return params, None
    scaled = lambda path, x: params.scale * x if path[-1] == "b" else x
    return params.base, traverse_util.path_aware_map(scaled, params.lora)


def model_params(params):
    """The parameters the model runs on: a LoRA run's merged weights W + A (s B) (DoRA's m V / ||V||), any other
    run's as they are."""
    return adapters.merged(*base_and_adapters(params))


def trained(params):
    """(what the optimizer trains, what it leaves): a LoRA run's adapters and its base; any other run's all, None."""
    return (params.lora, params.base) if isinstance(params, Adapted) else (params, None)


def joined(trained_params, frozen, like):
    """The inverse of `trained`: `like`'s kind of parameters from its two parts."""
    return like.replace(lora=trained_params, base=frozen) if isinstance(like, Adapted) else trained_params


def trained_roles(model_roles, lora: LoraConfig):
    """The roles of what the optimizer trains (`trained(params)[0]`): a model's own (`model_roles`), or with LoRA
    on, each adapter's, a matrix over its last two axes, and DoRA's magnitude a gain (as a norm's)."""
    if not lora.lora_rank:
        return model_roles
    kinds = {"a": _ADAPTER, "b": _ADAPTER} | ({"m": _MAGNITUDE} if lora.lora_variant == "dora" else {})
    return traverse_util.unflatten_dict(
        {(*path, x): r for path in targeted(model_roles, lora) for x, r in kinds.items()}
    )
