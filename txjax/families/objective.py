"""The training objective: the model's logits on a batch and the label-weighted cross-entropy, in float32.

    loss = sum_t w_t CE_t / sum_t w_t,     CE_t = -log p(y_t | context)     (w_t = 0 on padding and prompts)
    label smoothing eps (Szegedy et al. 2016, sec. 7): target (1 - eps) onehot(y) + eps / V, so
    CE_t^eps = (1 - eps) CE_t + eps mean_v(-log p(v)) = (1 - eps) CE_t + eps (logsumexp(z) - mean_v z_v)
    z-loss (Chowdhery et al. 2022, PaLM): objective += z_loss * logsumexp(z)^2 per token (train.z_loss)
    multi-token prediction: objective += mtp_weight * mean over the depths of their CE sums (`mtp_sums`)
    mixture of experts: objective += (sum_t w_t) (moe_aux_weight * balance + moe_z_weight * router z-loss), summed
    over the MoE layers (txjax.model.moe.aux_loss; `moe_sums`): the batch's mean per token, as a sum over tokens
Everything here returns sums over tokens, so batches and micro-batches add up exactly before the one division.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from txjax.families import family_of, init_params
from txjax.model import moe, mtp, ring_attention
from txjax.parallel.sharding import shardings_for


def params_shardings(model, mesh: Mesh):
    """Where each parameter lives on `mesh`, from its logical axes (sharding.LOGICAL_RULES); shapes only."""
    return shardings_for(jax.eval_shape(functools.partial(init_params, model, jax.random.key(0), boxed=True)), mesh)


def forward(model, params, batch, dropout_rng=None, adapters=None):
    """(logits f32[B, L, V], targets i32[B, L], weights f32[B, L], MoE statistics, depths) of an LM or seq2seq
    batch, in the batch's order, or in ring attention's zig-zag order when the mesh in context shards the sequence
    (ring_attention.layout; the sums over tokens are the same). Dropout is on iff a dropout rng is given. The
    statistics: each MoE layer's routing counts and auxiliary losses (txjax.model.moe; {} for a dense model). The
    depths: each multi-token prediction depth's (logits, targets, weights) (txjax.model.mtp; () without them).
    adapters: a LoRA run's, beside its base `params` (txjax.model.adapters).
    """
    family, batch = family_of(model), ring_attention.layout(batch)
    rngs = {} if dropout_rng is None else {"dropout": dropout_rng}
    kwargs = dict(deterministic=dropout_rng is None, rngs=rngs, mutable=[moe.MOE_STATS, mtp.MTP])
    logits_BxLxV, sown = family.logits(model, params, batch, adapters, **kwargs)
    targets, weights = (batch[k] for k in family.labels)
    depths = tuple(
        (logits_k, *mtp.depth_labels(targets, weights, batch["segment_ids"], k))
        for k, logits_k in enumerate(sown.get(mtp.MTP, {}).get("logits", ()), 1)
    )
    return logits_BxLxV, targets, weights, sown.get(moe.MOE_STATS, {}), depths


def hits(logits_BxLxV, targets_BxL):
    """bool[B, L]: the target is the argmax, read as z_y = max_v z_v (a max-reduce, which XLA:CPU runs several times
    faster than argmax's variadic reduce; a tie for first place counts as a hit)."""
    target_logit_BxL = jnp.take_along_axis(logits_BxLxV, targets_BxL[..., None], axis=-1)[..., 0]
    return target_logit_BxL >= logits_BxLxV.max(axis=-1)


def token_sums(logits_BxLxV, targets_BxL, weights_BxL, label_smoothing: float = 0.0, z_loss: float = 0.0) -> dict:
    """Weighted sums over the batch's tokens: loss (CE), objective (CE with label smoothing, plus z_loss *
    logsumexp(z)^2, PaLM's auxiliary loss that keeps the log-partition near 0), correct (argmax hits), weight
    (tokens counted)."""
    logits_BxLxV = logits_BxLxV.astype(jnp.float32)
    ce_BxL = optax.softmax_cross_entropy_with_integer_labels(logits_BxLxV, targets_BxL)
    objective_BxL = ce_BxL
    if label_smoothing or z_loss:
        log_z_BxL = jax.nn.logsumexp(logits_BxLxV, axis=-1)
    if label_smoothing:
        uniform_BxL = log_z_BxL - logits_BxLxV.mean(axis=-1)
        objective_BxL = (1.0 - label_smoothing) * ce_BxL + label_smoothing * uniform_BxL
    if z_loss:
        objective_BxL = objective_BxL + z_loss * jnp.square(log_z_BxL)
    correct_BxL = hits(logits_BxLxV, targets_BxL).astype(jnp.float32)
    return {
        "loss": (weights_BxL * ce_BxL).sum(),
        "objective": (weights_BxL * objective_BxL).sum(),
        "correct": (weights_BxL * correct_BxL).sum(),
        "weight": weights_BxL.sum(),
    }


def moe_sums(stats, weight, aux_weight: float, z_weight: float) -> dict:
    """The MoE terms of the objective as a sum over the batch's `weight` tokens ({} for a dense model): "moe_objective"
    (added to the objective), and the statistics themselves under "moe" (added over micro-batches)."""
    if not stats:
        return {}
    return {"moe_objective": weight * moe.aux_loss(stats, aux_weight, z_weight), "moe": stats}


def mtp_sums(depths, mtp_weight: float) -> dict:
    """The multi-token prediction terms as sums over tokens ({} without depths): "mtp_objective" = mtp_weight *
    mean_k sum_i w^k_i CE^k_i, added to the objective, so that after the one division by the main loss's tokens it is
    DeepSeek-V3's mtp_weight * mean_k L_k, L_k = (1/T) sum_i CE^k_i (eq. 24-25); and each depth's "mtp_loss" and
    "mtp_weight" [D] (its weighted CE and its targets: the depth's own mean loss, logged)."""
    if not depths:
        return {}
    each = [token_sums(*depth) for depth in depths]
    loss_D = jnp.stack([sums["loss"] for sums in each])
    weight_D = jnp.stack([sums["weight"] for sums in each])
    return {"mtp_objective": mtp_weight * loss_D.mean(), "mtp_loss": loss_D, "mtp_weight": weight_D}


def mtp_metrics(loss_D, weight_D) -> dict:
    """Each depth's mean loss over its own targets, "mtp_loss_1" ... (summed loss and weight [D]: mtp_sums')."""
    return {
        f"mtp_loss_{k}": loss / jnp.maximum(weight, 1.0) for k, (loss, weight) in enumerate(zip(loss_D, weight_D), 1)
    }
