"""The pure training step: one optimizer step of a TrainState on a batch, and its jitted form on a mesh.

train_step(state, batch, dropout_key) -> (state, metrics):
    g = grad_theta(sum_t w_t CE_t^eps) / sum_t w_t     numerator summed over the grad_accum micro-batches in a
                                                       lax.scan before the one division: the full batch's gradient
    theta, opt_state <- opt(clip(g))                   train.optimizer, the global norm clipped (txjax.state.optim)
    + mtp_weight * mean_k L_k                          multi-token prediction's depths (txjax.model.mtp)
    b <- b + gamma sign(mean n - n)                    an MoE sigmoid router's bias (train.moe_bias_rate)
With LoRA on (train.lora_rank > 0, txjax.state.lora) theta is the adapters alone: the base parameters are an
argument the gradient is not taken with respect to, and the optimizer's state holds the adapters' moments alone;
each block merges its weights as it runs, or with train.lora_dropout each projection adds s drop(x) A B to x W
(txjax.model.adapters).
Step s draws dropout masks from fold_in(dropout key, s). Everything that may differ between runs (parameters,
optimizer hyperparameters, batch, dropout key) is an argument, so the same function is jitted for one run and
vmapped for stacked runs (txjax.training.stack).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from txjax.families.objective import forward, moe_sums, mtp_metrics, mtp_sums, token_sums
from txjax.model import adapters as model_adapters
from txjax.model import moe
from txjax.parallel.distributed import first_device_mesh
from txjax.parallel.sharding import batch_sharding, on_mesh
from txjax.sections.train import TrainConfig
from txjax.state import lora
from txjax.state.optim import current_learning_rate
from txjax.state.train_state import TrainState, run_keys, state_shardings


def make_train_step(model, tx: optax.GradientTransformation, t: TrainConfig, mesh: Mesh | None = None):
    """jit(train_step, donate_argnums=0) for `model`, optimizer `tx` and the settings `t`, on `mesh` (default: the
    first device): the state laid out as train_state.state_shardings, the batch's rows split over data x fsdp and
    its length over sequence, traced under the mesh (sharding.on_mesh: ring attention when it shards the sequence)."""
    mesh = mesh or first_device_mesh()
    state_sharding = state_shardings(model, tx, t.seed, mesh, t.lora)
    train_step = train_step_function(model, tx, t)
    dropout_key = run_keys(t.seed)[1]
    return jax.jit(
        functools.partial(on_mesh(train_step, mesh), dropout_key=dropout_key),  # jit_train_step in profiles, logs
        in_shardings=(state_sharding, batch_sharding(mesh)),
        out_shardings=(state_sharding, NamedSharding(mesh, P())),
        donate_argnums=0,
    )


def train_step_function(model, tx: optax.GradientTransformation, t: TrainConfig):
    """The pure train_step(state, batch, dropout_key) -> (state, metrics), to jit, or to vmap over runs.

    Everything that may differ between runs (parameters, optimizer hyperparameters, batch, dropout key) is an argument.
    """
    lora_dropout = t.lora.lora_dropout if t.lora.lora_rank else 0.0
    dropout = model.cfg.dropout > 0 or model.cfg.attention_dropout > 0 or lora_dropout > 0

    def objective_sum(trained, frozen, like, batch, rng):
        params, adapters = lora.base_and_adapters(lora.joined(trained, frozen, like))  # merged layer by layer
        with model_adapters.dropout(lora_dropout):  # or, with train.lora_dropout, added beside each x W
            logits_BxLxV, targets_BxL, weights_BxL, stats, depths = forward(
                model, params, batch, rng if dropout else None, adapters
            )
        sums = token_sums(logits_BxLxV, targets_BxL, weights_BxL, t.label_smoothing, t.z_loss)
        sums |= moe_sums(stats, sums["weight"], t.moe_aux_weight, t.moe_z_weight) | mtp_sums(depths, t.mtp_weight)
        return sums["objective"] + sums.get("moe_objective", 0.0) + sums.get("mtp_objective", 0.0), sums

    grad_trained = jax.grad(objective_sum, has_aux=True)  # with respect to the trained parameters alone

    def train_step(state: TrainState, batch, dropout_key):
        rng = jax.random.fold_in(dropout_key, state.step)
        trained, frozen = lora.trained(state.params)
        grad_sums = lambda batch, rng: grad_trained(trained, frozen, state.params, batch, rng)
        if t.grad_accum == 1:
            grads, sums = grad_sums(batch, rng)
        else:  # micro-batch i holds rows i, i + A, i + 2A, ...: on a data-parallel mesh every device has a share
            micro = jax.tree_util.tree_map(lambda x: x.reshape(-1, t.grad_accum, *x.shape[1:]), batch)

            def add(total, i):
                one = jax.tree_util.tree_map(lambda x: x[:, i], micro)
                one_sums = grad_sums(one, jax.random.fold_in(rng, i))
                return jax.tree_util.tree_map(jnp.add, total, one_sums), None

            shapes = jax.eval_shape(grad_sums, jax.tree_util.tree_map(lambda x: x[:, 0], micro), rng)
            zeros = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
            (grads, sums), _ = jax.lax.scan(add, zeros, jnp.arange(t.grad_accum))
        weight = jnp.maximum(sums["weight"], 1.0)
        grads = jax.tree_util.tree_map(lambda g: g / weight, grads)
        updates, opt_state = tx.update(grads, state.opt_state, trained)
        trained = optax.apply_updates(trained, updates)
        if t.moe_bias_rate:  # DeepSeek-V3's aux-loss-free balancing, from this step's routing counts
            trained = moe.balance_biases(trained, sums["moe"], t.moe_bias_rate)
        finite = jnp.stack([jnp.isfinite(sums["loss"])] + [jnp.isfinite(p).all() for p in jax.tree.leaves(trained)])
        params = lora.joined(trained, frozen, state.params)
        return TrainState(step=state.step + 1, params=params, opt_state=opt_state), {
            "loss": sums["loss"] / weight,
            "token_accuracy": sums["correct"] / weight,
            "grad_norm": optax.tree.norm(grads),
            "target_tokens": sums["weight"],
            "finite": finite.all(),
            "learning_rate": current_learning_rate(t.optim, state.opt_state, state.step),
        } | (mtp_metrics(sums["mtp_loss"], sums["mtp_weight"]) if "mtp_loss" in sums else {})

    return train_step
