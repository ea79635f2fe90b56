"""The optimizer and its learning-rate schedule, built with optax from OptimConfig (config.train's settings).

Schedules (`train.schedule`), with a linear warmup from 0 over w = min(warmup_steps, S - 1) steps in all of them
(S = train.steps, r = min_lr_ratio, lr = learning_rate):
    cosine    lr (r + (1 - r) (1 + cos(pi (s - w) / (S - w))) / 2)
    linear    lr (1 - (1 - r) (s - w) / (S - w))
    constant  lr
    wsd       lr until D = S - decay_fraction (S - w), then linearly down to r lr at S (warmup-stable-decay)
Optimizers (`train.optimizer`), all after clipping the gradient's global norm (train.grad_clip > 0), with decoupled
weight decay w -= lr(t) weight_decay w on matrices and embeddings only (not on norm scales or biases, as nanoGPT):
    adamw     Loshchilov & Hutter 2019                       lion       Chen et al. 2023 (sign of the interpolation)
    adafactor Shazeer & Stern 2018 (factored second moments) muon       Jordan et al. 2024: the orthogonalized
              momentum (Newton-Schulz) on every weight matrix, AdamW on embeddings and the head, Adam on norms
              and biases;
              the attention kernels [d_model, heads, d_k] and [heads, d_k, d_model] are the matrices they are
              (d_model x heads*d_k and back, muon_weight_dimension_numbers), a scanned layer axis is a batch axis
    schedule_free_adamw  Defazio et al. 2024: no schedule (warmup, then constant); evaluation reads `eval_params`, the
              averaged point x = (y - (1 - b1) z) / b1, not the training iterate y.
The scalar settings (HYPERPARAMS) live in the optimizer state as arrays (optax.inject_hyperparams), not in the
compiled program: runs that differ only in them (and the seed) can be stacked and trained under jax.vmap.
WSD sized by a time budget (train.decay_start="budget", txjax.training.budget): the decay's start D and length n are
injected too (BUDGET_PLAN), so the step the training loop chose for them is saved in every checkpoint; the lr is
lr until step D, then linearly down to r lr at D + n.
muP (model.parametrization="mup", Yang et al. 2022, Table 8): every parameter's update is multiplied by its
`mup_lr_multipliers` entry, 1/m on the hidden matrices (m = d_model / base_width), 1 elsewhere, after the
optimizer: for AdamW and Lion, whose update is lr times a direction with the decoupled weight decay inside, that is
the per-layer learning rate lr / m (and weight decay coupled to it, as mup's MuAdamW). Adafactor (its updates scale
with the parameters' RMS), Muon (orthogonalized, its own width rule) and schedule-free AdamW (averaged iterates)
have their own width scaling and are refused with muP. The learning rate stays an injected hyperparameter.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
import optax.contrib

from txjax.fields import Range, ReadBy, at_least, setting, within
from txjax.state import lora

HYPERPARAMS = ("learning_rate", "warmup_steps", "min_lr_ratio", "weight_decay", "b1", "b2")  # traced, vmappable
SCHEDULES = ("cosine", "linear", "constant", "wsd")
_STATIC = ("steps", "grad_clip", "optimizer", "schedule", "decay_fraction")  # part of the compiled program
BUDGET_PLAN = ("decay_from", "decay_steps", "trained_s")  # decay_start="budget": injected, set by txjax.training.budget
MUP_OPTIMIZERS = ("adamw", "lion")


def learning_rate_at(
    step,
    learning_rate,
    warmup_steps,
    min_lr_ratio,
    steps,
    schedule="cosine",
    decay_fraction=0.2,
    decay_from=None,
    decay_steps=None,
):
    """The schedule's learning rate at `step` (see the module docstring); any number may be a traced array. WSD
    with `decay_from` D and `decay_steps` n given (a time budget's plan) decays over [D, D + n] instead."""
    w = jnp.minimum(warmup_steps, steps - 1)
    warm = step / jnp.maximum(w, 1)
    progress = jnp.clip((step - w) / (steps - w), 0.0, 1.0)  # 0 after warmup .. 1 at the last step
    if decay_from is None:
        decayed = jnp.clip((progress - 1.0) / decay_fraction + 1.0, 0.0, 1.0)
    else:
        decayed = jnp.clip((step - decay_from) / jnp.maximum(decay_steps, 1.0), 0.0, 1.0)
    after = {
        "cosine": lambda: min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + jnp.cos(jnp.pi * progress)),
        "linear": lambda: 1.0 - (1.0 - min_lr_ratio) * progress,
        "constant": lambda: jnp.ones_like(progress),
        "wsd": lambda: 1.0 - (1.0 - min_lr_ratio) * decayed,
    }[schedule]()
    return learning_rate * jnp.where(step < w, warm, after)


def current_learning_rate(o: OptimConfig, opt_state, step):
    """The learning rate the optimizer applies at `step`: its scalars read from the optimizer state (a stacked
    run's own), the schedule's shape from `o`."""
    h = opt_state.hyperparams
    schedule = "constant" if o.optimizer == "schedule_free_adamw" else o.schedule
    args = (h["learning_rate"], h["warmup_steps"], h["min_lr_ratio"], o.steps, schedule, o.decay_fraction)
    return learning_rate_at(step, *args, h.get("decay_from"), h.get("decay_steps"))


def decayed(roles):
    """True on the parameters weight decay applies to (their roles, txjax.model.roles: matrices, embeddings, the
    head; not norms' gains and biases)."""
    return jax.tree.map(lambda role: role.decayed, roles)


def muon_dimensions(roles):
    """Muon's dimension numbers of each parameter (params -> tree): a matrix role's reduction and output axes, its
    last `inputs` + `outputs` axes (in front: a scanned layer axis or the experts', batch axes); None: AdamW."""

    def axes(start: int, count: int):
        return start if count == 1 else tuple(range(start, start + count))

    def dims(role, leaf):
        if not role.hidden:
            return None
        n = jnp.ndim(leaf)
        inputs = axes(n - role.inputs - role.outputs, role.inputs)
        return optax.contrib.MuonDimensionNumbers(inputs, axes(n - role.outputs, role.outputs))

    return lambda params: jax.tree.map(dims, roles, nn.meta.unbox(params))


def mup_lr_multipliers(roles, cfg) -> dict:
    """muP's per-parameter Adam learning-rate multipliers (Yang et al. 2022, Table 8, relative to the base width):
    1/m on hidden matrices, 1 on vector-like ones (embeddings, the head, norms, biases); cfg: the ModelConfig."""
    m = cfg.width_multiplier
    return jax.tree.map(lambda role: 1.0 / m if role.hidden else 1.0, roles)


def _adamw(lr, b1, b2, weight_decay, roles):
    return optax.adamw(lr, b1=b1, b2=b2, weight_decay=weight_decay, mask=decayed(roles))


def _lion(lr, b1, b2, weight_decay, roles):
    return optax.lion(lr, b1=b1, b2=b2, weight_decay=weight_decay, mask=decayed(roles))


def _adafactor(lr, b1, b2, weight_decay, roles):
    """optax's weight_decay_rate is a per-step rate, not scaled by the learning rate: decoupled here as AdamW's."""
    direction = optax.adafactor(learning_rate=None)  # the negated update direction, before the learning rate
    decay = optax.add_decayed_weights(-weight_decay, decayed(roles))
    return optax.chain(direction, decay, optax.scale_by_schedule(lr))


def _muon(lr, b1, b2, weight_decay, roles):
    """optax's AdamW branch decays every parameter it gets: norms and biases go to a plain Adam."""
    muon = optax.contrib.muon(
        lr,
        weight_decay=weight_decay,
        adam_b1=b1,
        adam_b2=b2,
        adam_weight_decay=weight_decay,
        muon_weight_dimension_numbers=muon_dimensions(roles),
    )
    plain = optax.adam(lr, b1=b1, b2=b2, eps=1e-8, nesterov=True)  # muon's AdamW branch without the decay
    labels = jax.tree.map(lambda role: "decayed" if role.decayed else "plain", roles)
    return optax.partition({"decayed": muon, "plain": plain}, labels)


def _schedule_free_adamw(warm, b1, b2, weight_decay, roles):
    """`warm`: the warmup, then constant (no schedule); optax's version decays every parameter (it takes no mask)."""
    return optax.contrib.schedule_free_adamw(warm, b1=b1, b2=b2, weight_decay=weight_decay)


# train.optimizer -> its builder(learning-rate schedule, b1, b2, weight_decay, the parameters' roles): the one list
BUILDERS = {
    "adamw": _adamw,
    "lion": _lion,
    "adafactor": _adafactor,
    "muon": _muon,
    "schedule_free_adamw": _schedule_free_adamw,
}
OPTIMIZERS = tuple(BUILDERS)


_SCHEDULED = tuple(name for name in OPTIMIZERS if name != "schedule_free_adamw")
_CONSTANT_AFTER_WARMUP = "it keeps the learning rate constant after the warmup"
_BY_SCHEDULE = ReadBy("train.optimizer", _SCHEDULED, _CONSTANT_AFTER_WARMUP)
# train.b1 and b2: Adafactor's moments are its own (a factored second moment decaying as 1 - t^-0.8, no first one)
_MOMENTS = ReadBy(
    "train.optimizer", tuple(name for name in OPTIMIZERS if name != "adafactor"), "Adafactor's moments are its own"
)


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """config.train's optimizer and schedule settings (their schema: txjax.fields; validated by
    txjax.config.validate). The HYPERPARAMS are numbers, or traced arrays where stacked runs build their optimizers
    under jax.vmap (dataclasses.replace)."""

    steps: int = setting(1000, bounds=at_least(1))  # optimizer steps; decay_start="budget": the most it may take
    learning_rate: float = setting(1e-3, bounds=at_least(0))  # inf is allowed: the run diverges and says so
    optimizer: str = setting("adamw", choices=OPTIMIZERS, resume=False)
    schedule: str = setting("cosine", choices=SCHEDULES, read_by=(_BY_SCHEDULE,))  # each after a linear warmup
    decay_fraction: float = setting(  # wsd: the last 20% of the steps after warmup decay linearly
        0.2,
        bounds=within(0, 1, open_lo=True),
        read_by=(_BY_SCHEDULE, ReadBy("train.schedule", ("wsd",), "only wsd decays over a fraction of the steps")),
    )
    # wsd: "budget" decays over the last decay_fraction of max_minutes (txjax.training.budget)
    decay_start: str = setting("steps", choices=("steps", "budget"), resume=False)
    min_lr_ratio: float = setting(  # the schedule ends at learning_rate * min_lr_ratio
        0.1,
        bounds=within(0, 1),
        read_by=(
            _BY_SCHEDULE,
            ReadBy("train.schedule", ("cosine", "linear", "wsd"), "it stays at train.learning_rate"),
        ),
    )
    warmup_steps: int = setting(100, bounds=at_least(0))
    weight_decay: float = setting(0.1, bounds=at_least(0))
    b1: float = setting(0.9, bounds=within(0, 1, open_hi=True), read_by=(_MOMENTS,))
    b2: float = setting(0.99, bounds=within(0, 1, open_hi=True), read_by=(_MOMENTS,))
    grad_clip: float = setting(1.0, bounds=Range(lambda v: v >= 0, ">= 0 (0 = off)"))  # of the global norm

    @classmethod
    def of(cls, t) -> OptimConfig:
        """From a validated config.train section."""
        return cls(**{f.name: t[f.name] for f in dataclasses.fields(cls)})

    def hyperparams(self) -> dict:
        """The injected settings (HYPERPARAMS) by name: a resumed run writes these into its restored state."""
        return {name: getattr(self, name) for name in HYPERPARAMS}


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
    roles,
    multipliers=None,
    decay_from=None,
    decay_steps=None,
    trained_s=None,  # the budget's clock: saved with the plan, read by the loop only
):
    if optimizer == "schedule_free_adamw":  # no schedule of its own: the warmup, then constant
        schedule, decay_from, decay_steps = "constant", None, None
    lr = lambda count: learning_rate_at(
        count, learning_rate, warmup_steps, min_lr_ratio, steps, schedule, decay_fraction, decay_from, decay_steps
    )
    tx = BUILDERS[optimizer](lr, b1, b2, weight_decay, roles)
    if multipliers is not None:  # per-parameter learning rates: each update times its multiplier
        scale = lambda updates, params: jax.tree.map(lambda u, k: u * k, updates, multipliers)
        tx = optax.chain(tx, optax.stateless(scale))
    return optax.chain(optax.clip_by_global_norm(grad_clip), tx) if grad_clip > 0 else tx


def make_optimizer(o: OptimConfig, roles, model=None) -> optax.GradientTransformation:
    """The clipped optimizer of `o`, its schedule inside, for parameters of `roles` (their tree of
    txjax.model.roles.Role: txjax.families.param_roles of the model); `model` (the ModelConfig) brings muP's
    learning-rate multipliers."""
    if o.optimizer not in BUILDERS:
        raise ValueError(f"train.optimizer={o.optimizer!r} is not one of {', '.join(OPTIMIZERS)}")
    factory = optax.inject_hyperparams(_optimizer, static_args=(*_STATIC, "roles", "multipliers"))
    mup = model is not None and model.parametrization == "mup"
    multipliers = mup_lr_multipliers(roles, model) if mup else None
    settings = {name: getattr(o, name) for name in HYPERPARAMS + _STATIC}
    return factory(**settings, roles=roles, multipliers=multipliers, **step_plan(o))


def step_plan(o: OptimConfig) -> dict:
    """decay_start="budget": the plan before the budget decides, WSD sized by train.steps (D = S - f (S - w),
    n = S - D, what the run follows if the steps run out first), the clock at 0; else nothing to inject."""
    if o.decay_start != "budget":
        return {}
    w = jnp.minimum(o.warmup_steps, o.steps - 1)
    n = jnp.asarray(o.decay_fraction * (o.steps - w), jnp.float32)
    return {"decay_from": o.steps - n, "decay_steps": n, "trained_s": jnp.zeros((), jnp.float32)}


def eval_params(optimizer: str, state, merge: bool = True):
    """The model's parameters of a TrainState to evaluate: the training iterate, or schedule-free AdamW's averaged
    point; a LoRA run's merged (txjax.state.lora.model_params) unless not `merge`."""
    params = state.params
    if optimizer == "schedule_free_adamw":
        inner = state.opt_state.inner_state
        trained, frozen = lora.trained(params)
        # the schedule-free state alone, or after the clipping's empty state in a chain
        averaged = optax.contrib.schedule_free_eval_params(inner if hasattr(inner, "z") else inner[-1], trained)
        params = lora.joined(averaged, frozen, params)
    return lora.model_params(params) if merge else params
