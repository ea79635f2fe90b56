"""What an optimizer step updates: the TrainState pytree (the optimizer itself: txjax.state.optim), its initial value
and where its arrays live on a mesh."""

from __future__ import annotations

import functools
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

from txjax.families import init_params, param_roles
from txjax.parallel.sharding import shardings_for
from txjax.state import lora
from txjax.state.optim import OptimConfig, make_optimizer

NO_LORA = lora.LoraConfig()


@flax.struct.dataclass
class TrainState:
    step: jax.Array  # int32 scalar: optimizer steps done
    params: Any
    opt_state: Any


def run_keys(seed: int) -> tuple[jax.Array, jax.Array]:
    """(params key, dropout key) of a run; step s draws its dropout masks from fold_in(dropout key, s)."""
    params_key, dropout_key = jax.random.split(jax.random.key(seed))
    return params_key, dropout_key


def optimizer(model, o: OptimConfig, lora_config: lora.LoraConfig = NO_LORA) -> optax.GradientTransformation:
    """The run's optimizer (txjax.state.optim.make_optimizer) over what it trains: the model's parameters, or with
    LoRA on, the adapters alone (txjax.state.lora)."""
    return make_optimizer(o, lora.trained_roles(param_roles(model), lora_config), model.cfg)


def init_state(
    model, tx: optax.GradientTransformation, seed: int, boxed: bool = False, lora_config: lora.LoraConfig = NO_LORA
) -> TrainState:
    """Step 0: parameters drawn with the run's params key, fresh optimizer moments. Jit it or eval_shape it.
    `boxed` keeps the logical-axis metadata on the parameters and their moments (see state_shardings)."""
    return start_state(init_params(model, run_keys(seed)[0], boxed), tx, model, seed, lora_config)


def start_state(params, tx: optax.GradientTransformation, model, seed: int, lora_config=NO_LORA) -> TrainState:
    """Step 0 at the model's `params`: with LoRA on, the adapters drawn beside them (from the params key folded
    with 1), and fresh moments of what the optimizer trains."""
    if lora_config.lora_rank:
        key = jax.random.fold_in(run_keys(seed)[0], 1)
        params = lora.adapted(params, param_roles(model), lora_config, key)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(lora.trained(params)[0]))


def state_shardings(
    model, tx: optax.GradientTransformation, seed: int, mesh: Mesh, lora_config: lora.LoraConfig = NO_LORA
) -> TrainState:
    """Where each array of the state lives on `mesh`: parameters and their AdamW moments by their logical axes
    (sharding.LOGICAL_RULES), LoRA's adapters and theirs as their weights (lora.boxed_like), the step and counters
    replicated. Computed from shapes only (jax.eval_shape)."""
    init = functools.partial(init_state, model, tx, seed, boxed=True, lora_config=lora_config)
    return shardings_for(jax.eval_shape(init), mesh)


def with_hyperparams(state: TrainState, values: dict) -> TrainState:
    """The state with the optimizer's injected hyperparameters `values` ({name: number}, every stacked run's), each
    new array laid out as the one it replaces (so the train step sees the state it was compiled for)."""
    h = state.opt_state.hyperparams
    return state.replace(
        opt_state=state.opt_state._replace(hyperparams=h | {k: _filled(h[k], v) for k, v in values.items()})
    )


def _filled(x: jax.Array, value: float) -> jax.Array:
    full = np.full(x.shape, value, x.dtype)
    if not x.committed:  # stacked runs' states live uncommitted on the default device
        return jnp.asarray(full)
    return jax.make_array_from_callback(x.shape, x.sharding, lambda index: full[index])
