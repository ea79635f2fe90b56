"""Sweeps on Ray Tune (txjax.sweep.ray_launcher) against the in-process sweep, on one local Ray cluster of 2 CPUs
that the module's tests share (starting one takes seconds): the same runs end bit-identical, a trial whose process
is SIGKILLed resumes from its checkpoint and ends as if never killed, ASHA stops the worst settings. The search and
the sweep file's checks need no cluster."""

import json
import os
import signal
import threading
import time

import jax
import numpy as np
import pytest
from test_sweep import TINY, params_of, results, sweep_file

import txjax.sweep.local
from txjax import config as config_lib
from txjax.ops.metrics_log import read_metrics
from txjax.sweep.local import run_sweep
from txjax.sweep.spec import expand

ray = pytest.importorskip("ray", reason="the sweep extra: pip install -e '.[sweep]'")
from txjax.sweep.ray_launcher import _worker_env, run_on_ray  # noqa: E402 -- needs ray

pytestmark = pytest.mark.ray
STEPS = {**TINY, "train.steps": 20, "train.eval_every": 4, "train.checkpoint_every": 4}


@pytest.fixture(scope="module")
def cluster():
    """One local Ray cluster for the module; its workers inherit the suite's XLA flags and compilation cache."""
    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": _worker_env()}, log_to_driver=False)
    yield
    ray.shutdown()


def same_runs(a, b):
    """Every run of sweep folder a equals b's: parameters bit for bit, the same logged losses at the same steps.
    Exact by construction: a Ray worker compiles the in-process run's HLO with the same XLA flags (_worker_env) on
    the same machine, and runs it over the same batches."""
    assert sorted(results(a)) == sorted(results(b))
    for name in results(a):
        for x, y in zip(jax.tree_util.tree_leaves(params_of(a / name)), jax.tree_util.tree_leaves(params_of(b / name))):
            np.testing.assert_array_equal(x, y)
        losses = [[(r["split"], r["step"], r.get("loss")) for r in read_metrics(d / name)] for d in (a, b)]
        assert losses[0] == losses[1]


def test_a_sweep_on_ray_equals_the_in_process_sweep(cluster, tmp_path):
    # 2 trials at once (one per CPU), two seeds of one setting (one row of 2 in the table; trials of different
    # settings: the ASHA test), 8 steps: evals and checkpoints at 4 and 8
    fixed = {**STEPS, "train.steps": 8}
    sweep = sweep_file(tmp_path, fixed=fixed, grid={"train.learning_rate": [3e-3]}, seeds=[0, 1])
    on_ray = run_on_ray(sweep, tmp_path / "ray", [], vmap=False)
    assert [r.result["status"] for r in on_ray] == ["done"] * 2
    run_sweep(sweep, tmp_path / "local", [], vmap=False)
    same_runs(tmp_path / "ray", tmp_path / "local")
    evals = [r["step"] for r in read_metrics(tmp_path / "ray" / "learning_rate-0.003_seed-1") if r["split"] == "valid"]
    assert evals == [4, 8]
    table = (tmp_path / "ray" / "results.md").read_text()
    assert "| learning_rate=0.003 | 2/2 |" in table
    before = results(tmp_path / "ray")  # the rerun skips every finished run
    run_on_ray(sweep, tmp_path / "ray", [], vmap=False)
    assert results(tmp_path / "ray") == before


def test_a_killed_trial_resumes_from_its_checkpoint_and_ends_as_if_never_killed(cluster, tmp_path):
    sweep = sweep_file(tmp_path, fixed={**STEPS, "train.eval_every": 2, "train.checkpoint_every": 2})
    workdir = tmp_path / "ray"
    run = workdir / "seed-0"
    killed = []

    def kill_after_step_8():  # the trial's process, once it saved step 8: SIGKILL, no chance to save more
        while not (run / "checkpoints" / "8").is_dir():
            time.sleep(0.01)
        pid = json.loads((run / "writer.lock").read_text())["pid"]
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    threading.Thread(target=kill_after_step_8, daemon=True).start()
    (trained,) = run_on_ray(sweep, workdir, [])
    assert killed and trained.result["status"] == "done"
    records = read_metrics(run)
    assert [r["step"] for r in records if r["split"] == "valid"] == [2, 4, 6, 8, 10, 12, 14, 16, 18, 20]
    run_sweep(sweep, tmp_path / "local", [])  # never interrupted
    same_runs(workdir, tmp_path / "local")


def test_asha_stops_the_worst_settings(cluster, tmp_path):
    # the trials start in a seeded random order (1e-6, 3e-3, 1e-3, 1e-7): the worst one reaches each rung after
    # better ones and stops there; the best beats every rung
    rates = [3e-3, 1e-3, 1e-6, 1e-7]
    scheduler = {"kind": "asha", "metric": "valid_loss", "grace_steps": 4, "reduction_factor": 2}
    sweep = sweep_file(tmp_path, fixed=STEPS, grid={"train.learning_rate": rates}, scheduler=scheduler)
    runs = run_on_ray(sweep, tmp_path / "ray", [], max_concurrent=2)
    status = {r.settings["train.learning_rate"]: r.result for r in runs}
    assert status[3e-3]["status"] == "done"
    assert status[1e-7]["status"] == "stopped" and status[1e-7]["step"] < 20
    assert (tmp_path / "ray" / runs[3].name / "checkpoints").is_dir()  # a stopped run keeps its checkpoint
    assert "Stopped early by the scheduler" in (tmp_path / "ray" / "results.md").read_text()


def test_random_search_is_reproducible_by_seed(tmp_path):
    space = {"train.learning_rate": ("loguniform", 1e-4, 1e-2), "model.num_heads": ("choice", [1, 2])}
    names = {}
    for seed in (0, 0, 1):
        sweep = sweep_file(tmp_path, search={"kind": "random", "num_samples": 3, "seed": seed, "space": space})
        names.setdefault(seed, []).append([r.name for r in expand(sweep, [], tmp_path)])
    assert names[0][0] == names[0][1] and names[0][0] != names[1][0] and len(set(names[0][0])) == 3
    rates = [r.config.train.learning_rate for r in expand(sweep, [], tmp_path)]
    assert all(1e-4 <= lr < 1e-2 for lr in rates)


@pytest.mark.parametrize(
    "section, line",
    [
        ({"search": {"kind": "grid", "num_samples": 2, "space": {}}}, "search must be"),
        ({"search": {"kind": "random", "num_samples": 2, "space": {"train.lr": ("uniform", 0, 1)}}}, "train.lr"),
        ({"search": {"kind": "random", "num_samples": 2, "space": {"train.seed": ("normal", 0, 1)}}}, "is not one"),
        ({"search": {"kind": "random", "num_samples": 2, "space": {"train.b2": ("loguniform", 0, 1)}}}, "0 < lo"),
        ({"scheduler": {"kind": "hyperband"}}, "scheduler must be"),
    ],
)
def test_a_bad_sweep_file_is_one_line(tmp_path, section, line):
    with pytest.raises(config_lib.ConfigError, match=line) as error:
        sweep_file(tmp_path, **section)
    assert "\n" not in str(error.value)


def test_an_optuna_search_in_process_asks_the_same_points_again_and_skips_them(tmp_path, monkeypatch):
    space = {"train.learning_rate": ("loguniform", 1e-4, 1e-2), "model.num_heads": ("choice", [1, 2])}
    search = {"kind": "optuna", "num_samples": 3, "seed": 0, "space": space}
    sweep = sweep_file(tmp_path, search=search)
    first = [r.name for r in run_sweep(sweep, tmp_path / "out", [])]
    assert len(set(first)) == 3 and sorted(results(tmp_path / "out")) == sorted(first)

    def no_training(*args):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(txjax.sweep.local, "train_runs", no_training)
    assert [r.name for r in run_sweep(sweep, tmp_path / "out", [])] == first
