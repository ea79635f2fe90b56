"""WSD sized by the time budget (txjax.training.budget), on a fake clock that advances 1 s at every reading (the
loop reads it about twice per step): the decay starts when half the 15 s budget has passed, the learning rate is
constant before the recorded start and linear to min_lr after it, the run stops where the decay ends, at the end of
the budget; a run crashed after the decay started and resumed ends with the parameters of the run never stopped. The
runs are two stacked muP runs (width multiplier 2), so muP's vmapped training and its resume are tested here too."""

import jax
import numpy as np
import pytest
from test_optim import tiny

import txjax.training.edge
import txjax.training.loop
from txjax import config as config_lib
from txjax.experiment import build_dataset, build_model, load_workdir
from txjax.families import param_roles
from txjax.ops.metrics_log import read_metrics
from txjax.state.checkpoint import Checkpointer
from txjax.state.optim import OptimConfig, make_optimizer
from txjax.state.train_state import init_state
from txjax.training import budget
from txjax.training.stack import train_runs

LR, R, S, W = 1e-2, 0.1, 40, 2  # peak, min_lr_ratio, the steps' cap, warmup
FLAGS = [  # test_optim's toy run, 40 steps at most, every step logged
    f"--config.train.steps={S}",
    f"--config.train.warmup_steps={W}",
    f"--config.train.min_lr_ratio={R}",
    "--config.train.log_every=1",
    "--config.train.checkpoint_every=2",
    "--config.train.schedule=wsd",
    "--config.train.decay_fraction=0.5",
    "--config.train.max_minutes=0.25",
    "--config.train.decay_start=budget",
    "--config.model.parametrization=mup",  # and muP's per-layer learning rates, stacked and resumed with it
    "--config.model.base_width=8",
    "--config.model.attention_scale=linear",
]


def budget_config(*flags):
    return tiny("adamw", *FLAGS, *flags)


def fake_clock(monkeypatch):
    now = [0.0]

    def clock():
        now[0] += 1.0
        return now[0]

    monkeypatch.setattr(txjax.training.loop, "monotonic", clock)


def train_pair(workdirs, monkeypatch):
    """Two stacked runs, peaks LR and 2 LR, on a fresh fake clock."""
    fake_clock(monkeypatch)
    return train_runs([budget_config(f"--config.train.learning_rate={lr}") for lr in (LR, 2 * LR)], workdirs)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """(workdirs, results) of the pair trained without a stop."""
    workdirs = [tmp_path_factory.mktemp("straight") / name for name in ("a", "b")]
    with pytest.MonkeyPatch.context() as monkeypatch:
        return workdirs, train_pair(workdirs, monkeypatch)


def saved_plan(workdir) -> dict:
    """The plan in the workdir's last checkpoint."""
    config = config_lib.load(workdir)
    model = build_model(config)
    abstract = jax.eval_shape(
        lambda: init_state(
            model, make_optimizer(OptimConfig.of(config.train), param_roles(model), model.cfg), config.train.seed
        )
    )
    ckpt = Checkpointer(workdir / "checkpoints", 3)
    try:
        return budget.read(ckpt.restore(abstract))
    finally:
        ckpt.close()


def test_budget_wsd_corners_for_stacked_runs(straight):
    workdirs, results = straight
    plan = saved_plan(workdirs[0])
    assert plan == saved_plan(workdirs[1])
    d, n = int(plan["decay_from"]), int(plan["decay_steps"])
    assert W < d < S - 0.5 * (S - W) and n > 2  # decided by the clock, before the steps-sized decay would start
    for peak, result, workdir in zip((LR, 2 * LR), results, workdirs):
        assert result["step"] == d + n and result["runs_vmapped"] == 2  # the run ends where its decay ends
        assert result["train_step_compiles"] == 1  # writing the plan into the state changed none of its layout
        lr = {r["step"] - 1: r["learning_rate"] for r in read_metrics(workdir) if r["split"] == "train"}  # lr(count)
        for count, value in lr.items():
            expected = peak * (count / W if count < W else 1.0 - (1.0 - R) * np.clip((count - d) / n, 0, 1))
            assert value == pytest.approx(expected, rel=1e-5), count
        assert lr[d] == pytest.approx(peak) and lr[d + 1] < peak and max(lr) == d + n - 1
    assert abs(plan["trained_s"] - 15) <= 4  # the clock saved at the last step: the budget ends there (2 s a step)


def test_runs_resumed_after_the_decay_started_end_as_the_runs_never_stopped(straight, tmp_path, monkeypatch):
    d = int(saved_plan(straight[0][0])["decay_from"])
    crash_at = d + 1 + (d + 1) % 2  # an even step (a checkpoint) after the decay started

    class Crash(Exception):
        pass

    def crashing_dataset(*args):
        data = build_dataset(*args)
        batch = data.batch
        data.batch = lambda seed, k, *a: (_ for _ in ()).throw(Crash()) if k == crash_at + 1 else batch(seed, k, *a)
        return data

    monkeypatch.setattr(txjax.training.edge, "build_dataset", crashing_dataset)
    workdirs = [tmp_path / "a", tmp_path / "b"]
    with pytest.raises(Crash):
        train_pair(workdirs, monkeypatch)
    monkeypatch.undo()  # the real clock from here: the plan in the checkpoint decides
    assert Checkpointer(workdirs[0] / "checkpoints", 3).latest_step() == crash_at
    assert saved_plan(workdirs[0])["decay_from"] == d
    results = train_runs([budget_config(f"--config.train.learning_rate={lr}") for lr in (LR, 2 * LR)], workdirs)
    assert [r["step"] for r in results] == [r["step"] for r in straight[1]]
    for done, resumed in zip(straight[0], workdirs):
        a, b = (jax.device_get(load_workdir(w).params) for w in (done, resumed))
        for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
            np.testing.assert_array_equal(x, y)  # bit for bit by construction: one compiled step, the same batches


def test_budget_decay_needs_wsd_and_a_budget():
    with pytest.raises(config_lib.ConfigError, match="decay_start='budget' needs train.schedule=wsd and train"):
        budget_config("--config.train.max_minutes=0")
