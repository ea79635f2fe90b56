"""The optimizer and its learning-rate schedule, built from `config.train` with optax.

Schedules (`train.schedule`), with a linear warmup from 0 over w = min(warmup_steps, S - 1) steps in all of them
(S = train.steps, r = min_lr_ratio, lr = learning_rate):
    cosine    lr (r + (1 - r) (1 + cos(pi (s - w) / (S - w))) / 2)
    linear    lr (1 - (1 - r) (s - w) / (S - w))
    constant  lr
    wsd       lr until D = S - decay_fraction (S - w), then linearly down to r lr at S (warmup-stable-decay)
Optimizers (`train.optimizer`), all after clipping the gradient's global norm (train.grad_clip > 0), with decoupled
weight decay on matrices and embeddings only (not on norm scales or biases, as nanoGPT):
    adamw     Loshchilov & Hutter 2019                       lion       Chen et al. 2023 (sign of the interpolation)
    adafactor Shazeer & Stern 2018 (factored second moments) muon       Jordan et al. 2024: the orthogonalized
              momentum (Newton-Schulz) on every weight matrix, AdamW on embeddings, the head, norms and biases;
              the attention kernels [d_model, heads, d_k] and [heads, d_k, d_model] are the matrices they are
              (d_model x heads*d_k and back, muon_weight_dimension_numbers), a scanned layer axis is a batch axis
    schedule_free_adamw  Defazio et al. 2024: no schedule (warmup, then constant); evaluation reads `eval_params`, the
              averaged point x = (y - (1 - b1) z) / b1, not the training iterate y.
The scalar settings (HYPERPARAMS) live in the optimizer state as arrays (optax.inject_hyperparams), not in the
compiled program: runs that differ only in them (and the seed) can be stacked and trained under jax.vmap.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
import optax.contrib

HYPERPARAMS = ("learning_rate", "warmup_steps", "min_lr_ratio", "weight_decay", "b1", "b2")  # traced, vmappable
SCHEDULES = ("cosine", "linear", "constant", "wsd")
OPTIMIZERS = ("adamw", "lion", "adafactor", "muon", "schedule_free_adamw")
_STATIC = ("steps", "grad_clip", "optimizer", "schedule", "decay_fraction")  # part of the compiled program


def learning_rate_at(step, learning_rate, warmup_steps, min_lr_ratio, steps, schedule="cosine", decay_fraction=0.2):
    """The schedule's learning rate at `step` (see the module docstring); any number may be a traced array."""
    w = jnp.minimum(warmup_steps, steps - 1)
    warm = step / jnp.maximum(w, 1)
    progress = jnp.clip((step - w) / (steps - w), 0.0, 1.0)  # 0 after warmup .. 1 at the last step
    after = {
        "cosine": lambda: min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + jnp.cos(jnp.pi * progress)),
        "linear": lambda: 1.0 - (1.0 - min_lr_ratio) * progress,
        "constant": lambda: jnp.ones_like(progress),
        "wsd": lambda: 1.0 - (1.0 - min_lr_ratio) * jnp.clip((progress - 1.0) / decay_fraction + 1.0, 0.0, 1.0),
    }[schedule]()
    return learning_rate * jnp.where(step < w, warm, after)


def current_learning_rate(t, opt_state, step):
    """The learning rate the optimizer applies at `step`: its scalars read from the optimizer state (a stacked
    run's own), the schedule's shape from t = config.train."""
    h = opt_state.hyperparams
    schedule = "constant" if t["optimizer"] == "schedule_free_adamw" else t["schedule"]
    args = (h["learning_rate"], h["warmup_steps"], h["min_lr_ratio"], t["steps"], schedule, t["decay_fraction"])
    return learning_rate_at(step, *args)


def is_decayed(params):
    """True on the parameters weight decay applies to: all but norm scales and biases."""

    def decayed(path, _):
        name = path[-1].key
        return name not in ("scale", "bias") and not name.endswith("_bias")

    return jax.tree_util.tree_map_with_path(decayed, params, is_leaf=lambda x: isinstance(x, nn.meta.AxisMetadata))


def muon_dimensions(params):
    """Which axes of each parameter Muon orthogonalizes over (reduction, output); None: AdamW instead."""

    def dims(path, leaf):
        name, parent, n = path[-1].key, path[-2].key if len(path) > 1 else "", jnp.ndim(leaf)
        if name in ("query", "key", "value"):  # [..., d_model, heads, d_k]
            return optax.contrib.MuonDimensionNumbers(n - 3, (n - 2, n - 1))
        if name == "out":  # [..., heads, d_k, d_model]
            return optax.contrib.MuonDimensionNumbers((n - 3, n - 2), n - 1)
        if name == "kernel" and parent != "lm_head":  # the FFN's [..., in, out]
            return optax.contrib.MuonDimensionNumbers(n - 2, n - 1)
        return None  # embeddings, the untied head, norms, biases

    return jax.tree_util.tree_map_with_path(dims, nn.meta.unbox(params))


def _optimizer(
    learning_rate,
    warmup_steps,
    min_lr_ratio,
    weight_decay,
    b1,
    b2,
    steps,
    grad_clip,
    optimizer,
    schedule,
    decay_fraction,
):
    lr = lambda count: learning_rate_at(
        count, learning_rate, warmup_steps, min_lr_ratio, steps, schedule, decay_fraction
    )
    kind = optimizer
    if kind == "adamw":
        tx = optax.adamw(lr, b1=b1, b2=b2, weight_decay=weight_decay, mask=is_decayed)
    elif kind == "lion":
        tx = optax.lion(lr, b1=b1, b2=b2, weight_decay=weight_decay, mask=is_decayed)
    elif kind == "adafactor":
        tx = optax.adafactor(lr, weight_decay_rate=weight_decay, weight_decay_mask=is_decayed)
    elif kind == "muon":
        tx = optax.contrib.muon(
            lr,
            weight_decay=weight_decay,
            weight_decay_mask=is_decayed,
            adam_b1=b1,
            adam_b2=b2,
            adam_weight_decay=weight_decay,
            muon_weight_dimension_numbers=muon_dimensions,
        )
    else:  # schedule-free: the warmup, then constant; optax's version decays every parameter (it takes no mask)
        warm = lambda count: learning_rate_at(count, learning_rate, warmup_steps, min_lr_ratio, steps, "constant")
        tx = optax.contrib.schedule_free_adamw(warm, b1=b1, b2=b2, weight_decay=weight_decay)
    return optax.chain(optax.clip_by_global_norm(grad_clip), tx) if grad_clip > 0 else tx


def make_optimizer(t) -> optax.GradientTransformation:
    """The clipped optimizer of `t` (config.train, or a mapping with its fields in which the HYPERPARAMS may be
    traced arrays), its schedule inside."""
    factory = optax.inject_hyperparams(_optimizer, static_args=_STATIC)
    return factory(**{name: t[name] for name in HYPERPARAMS + _STATIC})


def eval_params(t, state):
    """The parameters of a TrainState to evaluate: the training iterate, or schedule-free AdamW's averaged point."""
    if t["optimizer"] != "schedule_free_adamw":
        return state.params
    inner = state.opt_state.inner_state
    # the schedule-free state alone, or after the clipping's empty state in a chain
    return optax.contrib.schedule_free_eval_params(inner if hasattr(inner, "z") else inner[-1], state.params)
