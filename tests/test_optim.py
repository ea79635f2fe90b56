"""Optimizers and schedules from config.train (txjax.state.optim) against direct optax calls and the formulas."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.contrib
import pytest

from txjax import config as config_lib
from txjax.model import roles
from txjax.state.optim import OPTIMIZERS, OptimConfig, eval_params, learning_rate_at, make_optimizer
from txjax.state.train_state import TrainState
from txjax.training.loop import train
from txjax.training.stack import train_runs

LR, W, S, R = 1e-2, 10, 110, 0.1  # peak, warmup, steps, min_lr_ratio


@pytest.mark.parametrize("schedule", ["cosine", "linear", "constant", "wsd"])
def test_schedules_at_their_corners(schedule):
    lr = lambda s, **kw: float(learning_rate_at(s, LR, W, R, S, schedule, **kw))
    assert lr(0) == 0.0 and lr(5) == pytest.approx(LR / 2) and lr(W) == pytest.approx(LR)  # the warmup
    end = {"cosine": R * LR, "linear": R * LR, "constant": LR, "wsd": R * LR}[schedule]
    assert lr(S) == pytest.approx(end)
    middle = {"cosine": (1 + R) / 2 * LR, "linear": (1 + R) / 2 * LR, "constant": LR, "wsd": LR}[schedule]
    assert lr(60) == pytest.approx(middle)  # halfway from the warmup's end to the last step
    if schedule == "wsd":  # stable until D = S - 0.2 (S - W) = 90, then linear down to R * LR
        assert lr(90) == pytest.approx(LR) and lr(100) == pytest.approx((1 + R) / 2 * LR)
        assert lr(85, decay_fraction=0.5) == pytest.approx((1 + R) / 2 * LR)  # D = 60: halfway to S at 85


# the roles txjax's modules give such parameters (txjax.model.roles), in the tree's structure
ROLES = {
    "embed": {"tokens": {"embedding": roles.EMBEDDING}},
    "attn": {"query": roles.QKV, "out": roles.OUT},
    "ffn": {"wi": {"kernel": roles.MATRIX, "bias": roles.BIAS}},
    "norm": {"scale": roles.NORM},
}
# weight decay on matrices and embeddings, not on norm scales and biases (as nanoGPT): written out, not derived
IS_DECAYED = {
    "embed": {"tokens": {"embedding": True}},
    "attn": {"query": True, "out": True},
    "ffn": {"wi": {"kernel": True, "bias": False}},
    "norm": {"scale": False},
}


def params_and_grads():
    """A parameter tree shaped like txjax's (attention kernels [D, H, K] / [H, K, D], an FFN kernel, an embedding,
    a norm scale: ROLES) and random gradients."""
    rng = np.random.default_rng(0)
    shapes = {
        "embed": {"tokens": {"embedding": (11, 8)}},
        "attn": {"query": (8, 2, 4), "out": (2, 4, 8)},
        "ffn": {"wi": {"kernel": (8, 16), "bias": (16,)}},
        "norm": {"scale": (8,)},
    }
    draw = lambda shape: jnp.asarray(rng.normal(size=shape), jnp.float32)
    params = jax.tree.map(draw, shapes, is_leaf=lambda x: isinstance(x, tuple))
    return params, [jax.tree.map(lambda p: draw(p.shape), params) for _ in range(3)]


def train_config(optimizer, **train):
    config = config_lib.base_config()
    config.train.update(**{"steps": S, "warmup_steps": W, "learning_rate": LR, "min_lr_ratio": R, **train})
    config.train.optimizer = optimizer
    return OptimConfig.of(config.train)


def direct(optimizer, t):
    """The same optimizer written as a direct optax call."""
    schedule = lambda n: learning_rate_at(n, LR, t.warmup_steps, R, S, t.schedule, t.decay_fraction)
    wd, b1, b2 = t.weight_decay, t.b1, t.b2
    tx = {
        "adamw": lambda: optax.adamw(schedule, b1=b1, b2=b2, weight_decay=wd, mask=IS_DECAYED),
        "lion": lambda: optax.lion(schedule, b1=b1, b2=b2, weight_decay=wd, mask=IS_DECAYED),
        "adafactor": lambda: optax.chain(
            optax.adafactor(None), optax.add_decayed_weights(-wd, IS_DECAYED), optax.scale_by_schedule(schedule)
        ),
        "muon": lambda: optax.partition(
            {
                "muon": optax.contrib.muon(
                    schedule,
                    weight_decay=wd,
                    adam_b1=b1,
                    adam_b2=b2,
                    adam_weight_decay=wd,
                    muon_weight_dimension_numbers={
                        "embed": {"tokens": {"embedding": None}},
                        "attn": {
                            "query": optax.contrib.MuonDimensionNumbers(0, (1, 2)),
                            "out": optax.contrib.MuonDimensionNumbers((0, 1), 2),
                        },
                        "ffn": {"wi": {"kernel": optax.contrib.MuonDimensionNumbers(0, 1), "bias": None}},
                        "norm": {"scale": None},
                    },
                ),
                "adam": optax.adam(schedule, b1=b1, b2=b2, nesterov=True),
            },
            {
                "embed": {"tokens": {"embedding": "muon"}},
                "attn": {"query": "muon", "out": "muon"},
                "ffn": {"wi": {"kernel": "muon", "bias": "adam"}},
                "norm": {"scale": "adam"},
            },  # fmt: skip
        ),
        "schedule_free_adamw": lambda: optax.contrib.schedule_free_adamw(
            lambda n: learning_rate_at(n, LR, t.warmup_steps, R, S, "constant"), b1=b1, b2=b2, weight_decay=wd
        ),
    }[optimizer]()
    return optax.chain(optax.clip_by_global_norm(t.grad_clip), tx)


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_each_optimizer_updates_as_the_direct_optax_call(optimizer):
    t = train_config(optimizer, schedule="wsd", warmup_steps=1)  # a non-zero learning rate from step 1
    params, grads = params_and_grads()
    ours, theirs = make_optimizer(t, ROLES), direct(optimizer, t)
    state_a, state_b = ours.init(params), theirs.init(params)
    a = b = params
    for g in grads:
        ua, state_a = jax.jit(ours.update)(g, state_a, a)
        ub, state_b = jax.jit(theirs.update)(g, state_b, b)
        a, b = optax.apply_updates(a, ua), optax.apply_updates(b, ub)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)
    assert not all(np.allclose(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(params)))
    evaluated = eval_params(t.optimizer, TrainState(step=jnp.int32(3), params=a, opt_state=state_a))
    if optimizer == "schedule_free_adamw":  # the averaged point, not the iterate
        expected = optax.contrib.schedule_free_eval_params(state_b[-1], b)
        for x, y in zip(jax.tree.leaves(evaluated), jax.tree.leaves(expected), strict=True):
            np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)
        assert not np.allclose(evaluated["attn"]["query"], a["attn"]["query"])
    else:
        assert evaluated is a


@pytest.mark.parametrize("optimizer", ["adamw", "lion", "adafactor", "muon"])
def test_weight_decay_is_decoupled_and_follows_the_learning_rate(optimizer):
    """With zero gradients an update is the decay alone: -lr(step) * weight_decay * w on matrices and embeddings,
    nothing on norm scales and biases (optax's adafactor alone decays by weight_decay per step, whatever the rate)."""
    t = train_config(optimizer, warmup_steps=0)
    params, _ = params_and_grads()
    tx = make_optimizer(t, ROLES)
    state = tx.init(params)
    zeros = jax.tree.map(jnp.zeros_like, params)
    for _ in range(3):  # the third update is at step 2
        updates, state = jax.jit(tx.update)(zeros, state, params)
    lr = float(learning_rate_at(2, LR, 0, R, S, t.schedule, t.decay_fraction))
    assert 0 < lr < LR  # the schedule is decaying: a rate-independent decay would not match
    for w, u, on in zip(*(jax.tree.leaves(x) for x in (params, updates, IS_DECAYED)), strict=True):
        np.testing.assert_allclose(u, -lr * t.weight_decay * w if on else 0 * w, rtol=1e-5, atol=1e-8)


def test_muon_orthogonalizes_the_attention_kernels_as_matrices():
    """The query kernel [D, H, K] is updated as the D x (H K) matrix it is: Muon's update of it equals Muon's update
    of that matrix, reshaped (an orthogonalization per head, the wrong reading, differs)."""
    t = train_config("muon", warmup_steps=0)
    params, grads = params_and_grads()
    tx = make_optimizer(t, ROLES)
    update, _ = tx.update(grads[0], tx.init(params), params)
    clipped = optax.clip_by_global_norm(t.grad_clip).update(grads[0], optax.EmptyState())[0]
    matrix = {"w": params["attn"]["query"].reshape(8, 8)}
    reference_tx = optax.contrib.muon(LR, weight_decay=t.weight_decay)
    reference, _ = reference_tx.update({"w": clipped["attn"]["query"].reshape(8, 8)}, reference_tx.init(matrix), matrix)
    np.testing.assert_allclose(update["attn"]["query"].reshape(8, 8), reference["w"], rtol=1e-5, atol=1e-7)
    per_head = {"w": params["attn"]["query"][:, 0]}  # one head's [D, K] block on its own
    head_update, _ = reference_tx.update({"w": clipped["attn"]["query"][:, 0]}, reference_tx.init(per_head), per_head)
    assert not np.allclose(update["attn"]["query"][:, 0], head_update["w"], atol=1e-4)


def tiny(optimizer, *flags):
    return config_lib.from_command_line(
        None,
        [
            "--config.data.max_digits=3",
            "--config.data.eval_size=8",
            "--config.model.num_layers=1",
            "--config.model.num_heads=2",
            "--config.model.d_model=16",
            "--config.model.d_ff=32",
            "--config.train.steps=4",
            "--config.train.batch_size=4",
            "--config.train.log_every=2",
            "--config.train.eval_every=0",
            "--config.train.checkpoint_every=4",
            f"--config.train.optimizer={optimizer}",
            *flags,
        ],
    )


@pytest.mark.parametrize("optimizer", ["muon"])
def test_runs_train_with_the_optimizer_and_stack_over_its_scalars(optimizer, tmp_path):
    """The training loop runs the optimizer, and two runs that differ in its learning rate train as one vmapped
    program with their own learning rates (muP's stacked runs: tests/test_budget.py)."""
    configs = [
        tiny(optimizer, f"--config.train.learning_rate={lr}", "--config.train.schedule=wsd") for lr in (1e-3, 3e-3)
    ]
    results = train_runs(configs, [tmp_path / "a", tmp_path / "b"])
    assert [r["runs_vmapped"] for r in results] == [2, 2] and all(np.isfinite(r["valid_loss"]) for r in results)
    assert results[0]["valid_loss"] != results[1]["valid_loss"]


def test_muon_trains_a_single_run(tmp_path):
    """One run (not stacked) lays out Muon's state on the mesh: optax.partition leaves MaskedNode placeholders for
    the parameters its other transform takes, which have no shape to shard (`run.py train` crashed on them)."""
    result = train(tiny("muon"), tmp_path)
    assert result["runs_vmapped"] == 1 and np.isfinite(result["valid_loss"])


def test_a_bad_optimizer_or_schedule_is_one_line():
    with pytest.raises(config_lib.ConfigError, match="config.train.optimizer='adam' is not one of"):
        tiny("adam")
    with pytest.raises(config_lib.ConfigError, match="decay_fraction=0.0 must be in"):
        tiny("adamw", "--config.train.decay_fraction=0")


def test_the_optimizer_table_refuses_an_unknown_name():
    """The library's own entry (not only the config's validation) builds no optimizer for a name it does not list."""
    with pytest.raises(ValueError, match="train.optimizer='adam' is not one of adamw, lion"):
        make_optimizer(dataclasses.replace(train_config("adamw"), optimizer="adam"), ROLES)
