"""Sweeps on Ray Tune (txjax.sweep.ray_launcher) against the in-process sweep, on one local Ray cluster of 2 CPUs
that the module's tests share (starting one takes seconds): the same runs end bit-identical, a trial whose process
is SIGKILLed resumes from its checkpoint and ends as if never killed (both from one sweep on Ray, its runs' in-process
twins trained once), a rerun starts no trial, ASHA stops the worse setting, a cluster's GCS passes --address's
checks. The search, the sweep file's checks and an --address where no Ray cluster answers need no cluster."""

import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import jax
import numpy as np
import pytest
from test_clean_errors import REPO
from test_sweep import TINY, params_of, results, sweep_file

import txjax.sweep.local
from txjax import config as config_lib
from txjax.ops.metrics_log import read_metrics
from txjax.sweep.local import run_sweep
from txjax.sweep.spec import expand

ray = pytest.importorskip("ray", reason="the sweep extra: pip install -e '.[sweep]'")
from txjax.sweep.ray_launcher import (  # noqa: E402 -- needs ray
    _answers_in_text,
    _gcs_answers,
    _worker_env,
    run_on_ray,
)

pytestmark = pytest.mark.ray
STEPS = {**TINY, "train.steps": 8, "train.eval_every": 2, "train.checkpoint_every": 2}


@pytest.fixture(scope="module")
def cluster():
    """One local Ray cluster for the module; its workers inherit the suite's XLA flags and compilation cache."""
    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": _worker_env()}, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def swept(cluster, tmp_path_factory):
    """One sweep, two seeds of one setting (one row of 2 in the table; trials of different settings: the ASHA test),
    run by run: on Ray in `ray/` (2 trials at once, one per CPU), the trial of seed 0 SIGKILLed once it saved step 4
    (no chance to save more; Tune retries it), and in-process in `local/`. Returns (the folder, the sweep, each kill's
    (pid, whether its run had finished then))."""
    root = tmp_path_factory.mktemp("swept")
    sweep = sweep_file(root, fixed=STEPS, grid={"train.learning_rate": [3e-3]}, seeds=[0, 1])
    run = root / "ray" / "learning_rate-0.003_seed-0"
    killed = []

    def kill_after_step_4():
        while not (run / "checkpoints" / "4").is_dir():
            time.sleep(0.01)
        pid = json.loads((run / "writer.lock").read_text())["pid"]
        killed.append((pid, (run / "result.json").exists()))
        os.kill(pid, signal.SIGKILL)

    threading.Thread(target=kill_after_step_4, daemon=True).start()
    on_ray = run_on_ray(sweep, root / "ray", [], vmap=False)
    assert [r.result["status"] for r in on_ray] == ["done"] * 2
    run_sweep(sweep, root / "local", [], vmap=False)
    return root, sweep, killed


def same_run(a, b):
    """Run folder a equals b: parameters bit for bit, the same logged losses at the same steps. Exact by
    construction: a Ray worker compiles the in-process run's HLO with the same XLA flags (_worker_env) on the same
    machine, and runs it over the same batches."""
    for x, y in zip(jax.tree_util.tree_leaves(params_of(a)), jax.tree_util.tree_leaves(params_of(b))):
        np.testing.assert_array_equal(x, y)
    losses = [[(r["split"], r["step"], r.get("loss")) for r in read_metrics(d)] for d in (a, b)]
    assert losses[0] == losses[1]


def valid_steps(run):
    return [r["step"] for r in read_metrics(run) if r["split"] == "valid"]


def test_a_sweep_on_ray_equals_the_in_process_sweep(swept, capsys):
    root, sweep, _ = swept
    assert sorted(results(root / "ray")) == sorted(results(root / "local"))
    for name in results(root / "ray"):  # seed 1's trial never stopped; seed 0's: the killed-trial test
        same_run(root / "ray" / name, root / "local" / name)
    assert valid_steps(root / "ray" / "learning_rate-0.003_seed-1") == [2, 4, 6, 8]
    assert "| learning_rate=0.003 | 2/2 |" in (root / "ray" / "results.md").read_text()
    before = results(root / "ray")  # the rerun skips every finished run: no trial at all
    run_on_ray(sweep, root / "ray", [], vmap=False)
    assert results(root / "ray") == before and "2 runs or points, 0 trials" in capsys.readouterr().out


def test_a_killed_trial_resumes_from_its_checkpoint_and_ends_as_if_never_killed(swept):
    root, _, killed = swept
    name = "learning_rate-0.003_seed-0"
    ((_, finished_then),) = killed  # killed once, before its run finished
    assert not finished_then
    assert results(root / "ray")[name]["status"] == "done"
    assert valid_steps(root / "ray" / name) == [2, 4, 6, 8]
    same_run(root / "ray" / name, root / "local" / name)  # never interrupted


def test_asha_stops_the_worst_setting(cluster, tmp_path):
    # one trial at a time, in the seeded random order of _trials (2 settings: the grid's, 3e-3 then 1e-7): the worse
    # one reaches the rung at step 4 after the better one and stops there; the better one passes both rungs (4, 8)
    scheduler = {"kind": "asha", "metric": "valid_loss", "grace_steps": 4, "reduction_factor": 2}
    fixed = {**STEPS, "train.eval_every": 4, "train.checkpoint_every": 4}
    sweep = sweep_file(tmp_path, fixed=fixed, grid={"train.learning_rate": [3e-3, 1e-7]}, scheduler=scheduler)
    runs = {r.settings["train.learning_rate"]: r for r in run_on_ray(sweep, tmp_path / "ray", [], max_concurrent=1)}
    assert runs[3e-3].result["status"] == "done"
    assert runs[1e-7].result == {"status": "stopped", "step": 4}
    assert (runs[1e-7].workdir / "checkpoints").is_dir()  # a stopped run keeps its checkpoint
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
    search = {"kind": "optuna", "num_samples": 2, "seed": 0, "space": space}
    sweep = sweep_file(tmp_path, search=search)
    first = [r.name for r in run_sweep(sweep, tmp_path / "out", [])]
    assert len(set(first)) == 2 and sorted(results(tmp_path / "out")) == sorted(first)

    def no_training(*args):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(txjax.sweep.local, "train_runs", no_training)
    assert [r.name for r in run_sweep(sweep, tmp_path / "out", [])] == first


def test_an_address_where_a_web_server_answers_is_one_line_within_a_minute(tmp_path):
    """Something other than Ray's GCS listens at --address (an HTTP server here): TCP connects, and ray.init alone
    would retry past 300 s; its answer to the HTTP/2 preface is text, not a GCS's binary frames, so the sweep ends
    at once in one line, nothing written (a GCS gets through: the test below)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    address = f"127.0.0.1:{server.server_address[1]}"
    sweep_file(tmp_path)
    command = [sys.executable, str(REPO / "run.py"), "sweep", f"--sweep={tmp_path / 'sweep.py'}"]
    command += [f"--workdir={tmp_path / 'out'}", "--launcher=ray", f"--address={address}"]
    start = time.monotonic()
    try:
        done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=60)
    finally:
        server.shutdown()
    assert done.returncode == 2 and time.monotonic() - start < 60, done.stderr[-2000:]
    assert done.stderr.startswith(f"error: --address={address}: something answers there, but not a Ray cluster's GCS")
    assert done.stderr.count("\n") == 1 and not (tmp_path / "out").exists(), done.stderr[-2000:]


def test_a_clusters_gcs_passes_the_address_checks(cluster):
    """--address=HOST:PORT of a running cluster: its GCS answers the HTTP/2 preface in binary frames (not refused as
    the web server above) and Ray's GCS client, asked in a child process, finds it."""
    host, _, port = ray.get_runtime_context().gcs_address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        assert not _answers_in_text(connection)
    assert _gcs_answers(f"{host}:{port}")
