"""What an optimizer step updates: the TrainState pytree, and the optimizer built from `config.train`.

    AdamW (Loshchilov & Hutter 2019) with decoupled weight decay on matrices and embeddings only (not on norm
    scales or biases, as nanoGPT), after clipping the gradient's global norm;
    learning rate: linear warmup from 0 to learning_rate over warmup_steps, then cosine decay to
    learning_rate * min_lr_ratio at the last step.
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


def learning_rate_schedule(t) -> optax.Schedule:
    """Warmup + cosine decay over `t.steps` optimizer steps (t = config.train)."""
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=t.learning_rate, warmup_steps=min(t.warmup_steps, t.steps - 1),
        decay_steps=t.steps, end_value=t.learning_rate * t.min_lr_ratio)


def _decayed(params):
    """True on the parameters weight decay applies to: all but norm scales and biases."""
    def is_decayed(path, _):
        name = path[-1].key
        return name not in ("scale", "bias") and not name.endswith("_bias")
    return jax.tree_util.tree_map_with_path(is_decayed, params, is_leaf=lambda x: isinstance(x, nn.meta.AxisMetadata))


def make_optimizer(t) -> optax.GradientTransformation:
    """Clip by global norm (t.grad_clip > 0), then AdamW with the warmup + cosine schedule."""
    adamw = optax.adamw(learning_rate_schedule(t), b1=t.b1, b2=t.b2, weight_decay=t.weight_decay, mask=_decayed)
    return optax.chain(optax.clip_by_global_norm(t.grad_clip), adamw) if t.grad_clip > 0 else adamw


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
