"""What an optimizer step updates: the TrainState pytree, and the optimizer built from `config.train`.

    AdamW (Loshchilov & Hutter 2019) with decoupled weight decay on matrices and embeddings only (not on norm
    scales or biases, as nanoGPT), after clipping the gradient's global norm;
    learning rate: linear warmup from 0 to learning_rate over warmup_steps, then cosine decay to
    learning_rate * min_lr_ratio at the last step.
The scalar settings (HYPERPARAMS) live in the optimizer state as arrays (optax.inject_hyperparams), not in the
compiled program: runs that differ only in them (and the seed) can be stacked and trained under jax.vmap.
"""

from __future__ import annotations

import functools
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from txjax.objective import init_params
from txjax.sharding import shardings_for


@flax.struct.dataclass
class TrainState:
    step: jax.Array  # int32 scalar: optimizer steps done
    params: Any
    opt_state: Any


HYPERPARAMS = ("learning_rate", "warmup_steps", "min_lr_ratio", "weight_decay", "b1", "b2")  # traced, vmappable


def learning_rate_at(step, learning_rate, warmup_steps, min_lr_ratio, steps):
    """lr(s) = learning_rate * s / w for s < w, then learning_rate * (r + (1 - r) (1 + cos(pi (s - w) / (S - w))) / 2)
    with w = min(warmup_steps, S - 1), r = min_lr_ratio, S = steps. Any argument may be a traced array."""
    w = jnp.minimum(warmup_steps, steps - 1)
    warm = step / jnp.maximum(w, 1)
    cosine = 0.5 * (1.0 + jnp.cos(jnp.pi * jnp.clip((step - w) / (steps - w), 0.0, 1.0)))
    return learning_rate * jnp.where(step < w, warm, min_lr_ratio + (1.0 - min_lr_ratio) * cosine)


def current_learning_rate(opt_state, step):
    """The learning rate the optimizer applies at `step` (read from the hyperparameters in its state)."""
    h = opt_state.hyperparams
    return learning_rate_at(step, h["learning_rate"], h["warmup_steps"], h["min_lr_ratio"], h["steps"])


def _decayed(params):
    """True on the parameters weight decay applies to: all but norm scales and biases."""

    def is_decayed(path, _):
        name = path[-1].key
        return name not in ("scale", "bias") and not name.endswith("_bias")

    return jax.tree_util.tree_map_with_path(is_decayed, params, is_leaf=lambda x: isinstance(x, nn.meta.AxisMetadata))


def _clipped_adamw(learning_rate, warmup_steps, min_lr_ratio, weight_decay, b1, b2, steps, grad_clip):
    schedule = lambda count: learning_rate_at(count, learning_rate, warmup_steps, min_lr_ratio, steps)
    adamw = optax.adamw(schedule, b1=b1, b2=b2, weight_decay=weight_decay, mask=_decayed)
    return optax.chain(optax.clip_by_global_norm(grad_clip), adamw) if grad_clip > 0 else adamw


def make_optimizer(t) -> optax.GradientTransformation:
    """Clip by global norm (t.grad_clip > 0), then AdamW with the warmup + cosine schedule.

    t: config.train, or a mapping with its fields in which the HYPERPARAMS may be traced arrays.
    """
    factory = optax.inject_hyperparams(_clipped_adamw, static_args=("grad_clip",))
    return factory(**{name: t[name] for name in HYPERPARAMS}, steps=t["steps"], grad_clip=t["grad_clip"])


def run_keys(seed: int) -> tuple[jax.Array, jax.Array]:
    """(params key, dropout key) of a run; step s draws its dropout masks from fold_in(dropout key, s)."""
    params_key, dropout_key = jax.random.split(jax.random.key(seed))
    return params_key, dropout_key


def init_state(model, tx: optax.GradientTransformation, seed: int, boxed: bool = False) -> TrainState:
    """Step 0: parameters drawn with the run's params key, fresh optimizer moments. Jit it or eval_shape it.
    `boxed` keeps the logical-axis metadata on the parameters and their moments (see state_shardings)."""
    params = init_params(model, run_keys(seed)[0], boxed)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))


def state_shardings(model, tx: optax.GradientTransformation, seed: int, mesh: Mesh) -> TrainState:
    """Where each array of the state lives on `mesh`: parameters and their AdamW moments by their logical axes
    (sharding.LOGICAL_RULES), the step and counters replicated. Computed from shapes only (jax.eval_shape)."""
    return shardings_for(jax.eval_shape(functools.partial(init_state, model, tx, seed, boxed=True)), mesh)
