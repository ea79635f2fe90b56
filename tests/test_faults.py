"""Faults a run survives: SIGTERM / SIGINT (a checkpoint of the current step, then a rerun as if never stopped), a
SIGKILL at seeded random points (during a step, a save, an eval), a second writer on the workdir, and a preemption
of one of two jax.distributed processes. tests/fault_driver.py sends each signal at an exact point of `run.py`,
here or in a subprocess; the runs are compared bit for bit with an uninterrupted run."""

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from fault_driver import inject, run
from test_train import TINY_FLAGS

from txjax import config as config_lib
from txjax.experiment import load_workdir
from txjax.ops.metrics_log import read_metrics
from txjax.state.checkpoint import Checkpointer
from txjax.training.loop import train

REPO = Path(__file__).resolve().parents[1]

# 12 steps, checkpoints at 3, 6, 9, 12, evals of 2 batches at 4 and 8, a final eval of 3 batches (20 examples)
FLAGS = [
    *TINY_FLAGS,
    "--config.model.dropout=0.1",
    "--config.train.steps=12",
    "--config.train.eval_every=4",
    "--config.train.eval_batches=2",
    "--config.train.checkpoint_every=3",
]
STOPPED = "stopped by {} at step {}; checkpoint saved; run the same command to resume"


def faulty(signal_name: str, where: str, n: int, *args: str) -> subprocess.CompletedProcess:
    """run.py ARGS in a subprocess that sends itself SIG<signal_name> at the n-th `where` (tests/fault_driver.py)."""
    command = [sys.executable, str(REPO / "tests" / "fault_driver.py"), signal_name, where, str(n), *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=300)


def run_here(capsys, *args: str) -> tuple[int, str]:
    """run.py ARGS in this process: (exit status, the last line on stderr)."""
    capsys.readouterr()
    status = run.main(list(args))
    return status, (capsys.readouterr().err.strip().splitlines() or [""])[-1]


def params_of(workdir):
    return jax.device_get(load_workdir(workdir).params)


def assert_trees_equal(a, b):
    # bit for bit by construction: a resumed run is the uninterrupted run's compiled step (the same HLO, XLA flags and
    # machine, in this process or a subprocess) over the same batches from the same state
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)


def latest(workdir) -> int | None:
    return Checkpointer(Path(workdir) / "checkpoints", 3).latest_step()


def valid_losses(workdir) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in read_metrics(workdir) if r["split"] == "valid"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run."""
    workdir = tmp_path_factory.mktemp("faults") / "reference"
    train(config_lib.from_command_line(None, FLAGS), workdir)
    return workdir


def test_sigterm_and_sigint_save_the_current_step_and_the_rerun_is_bit_exact(reference, tmp_path, capsys):
    """SIGTERM in step 5 (not a checkpoint step): exit 75 with the one line and a checkpoint of step 5. SIGINT in
    the resumed run's first eval (step 8): that eval is dropped and step 8 saved. The third run does the eval of
    step 8 first and ends where the uninterrupted run did, bit for bit, with the same evals."""
    args = ["train", f"--workdir={tmp_path / 'run'}", *FLAGS]
    with inject("TERM", "batch", 5):
        assert run_here(capsys, *args) == (75, STOPPED.format("SIGTERM", 5))
    assert latest(tmp_path / "run") == 5 and not (tmp_path / "run" / "eval_valid.json").exists()
    with inject("INT", "eval", 1):
        assert run_here(capsys, *args) == (75, STOPPED.format("SIGINT", 8))
    assert latest(tmp_path / "run") == 8 and [step for step, _ in valid_losses(tmp_path / "run")] == [4]
    assert run_here(capsys, *args)[0] == 0
    assert_trees_equal(params_of(reference), params_of(tmp_path / "run"))
    assert valid_losses(tmp_path / "run") == valid_losses(reference)


def test_sigkill_at_random_points_then_rerun_gives_the_uninterrupted_parameters(reference, tmp_path):
    """`run.py train` SIGKILLed at three points drawn by a seeded rng (during a save, after its files are written;
    in an eval; in a step), each time run again; the last run (in this process) completes. A killed writer leaves
    no lock behind."""
    rng = random.Random(15)
    points = [("save", 1), ("eval", rng.randint(1, 2)), ("batch", rng.randint(2, 4))]
    rng.shuffle(points)
    args = ["train", f"--workdir={tmp_path / 'run'}", *FLAGS]
    for where, n in points:
        killed = faulty("KILL", where, n, *args)
        assert killed.returncode == -signal.SIGKILL, (where, n, killed.stderr[-2000:])
    assert run.main(args) == 0, points  # the last run here, in this process
    assert_trees_equal(params_of(reference), params_of(tmp_path / "run"))


def test_a_second_writer_is_refused_and_readers_read(reference, capsys):
    """While a writer holds the workdir (here: a lock taken in this process, another open file to flock), `run.py
    train` on it ends at once with one line naming the holder's pid and host and changes nothing; eval reads it."""
    from txjax.ops.workdir_lock import hold

    before = (reference / "metrics.jsonl").read_text()
    with hold(reference):
        capsys.readouterr()
        assert run.main(["train", f"--workdir={reference}", *FLAGS]) == 2
        refused = capsys.readouterr().err.strip().splitlines()
        assert run.main(["eval", f"--workdir={reference}"]) == 0
        assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["step"] == 12
    errors = [line for line in refused if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0] == refused[-1], refused
    assert f"being written by another run (pid {os.getpid()} on host {socket.gethostname()}" in errors[0]
    assert (reference / "metrics.jsonl").read_text() == before


def test_a_preempted_sweep_stops_and_the_rerun_continues(tmp_path, capsys):
    """Two seeds trained together (one vmapped program): SIGTERM in step 5 saves both runs at step 5 and stops the
    sweep (exit 75, no result recorded); the rerun resumes both from there and finishes them (that a resumed group
    ends where an uninterrupted one does: tests/test_sweep.py)."""
    fixed = dict(flag.removeprefix("--config.").split("=") for flag in FLAGS)
    path = tmp_path / "sweep.py"
    path.write_text(
        f"def get_sweep():\n    return {dict(experiment='experiments/reverse.py', fixed=fixed, seeds=[0, 1])!r}\n"
    )
    args = ["sweep", f"--sweep={path}", f"--workdir={tmp_path / 'sweep'}"]
    with inject("TERM", "batch", 5):
        assert run_here(capsys, *args) == (75, STOPPED.format("SIGTERM", 5))
    runs = [tmp_path / "sweep" / f"seed-{seed}" for seed in (0, 1)]
    assert [latest(w) for w in runs] == [5, 5] and not list((tmp_path / "sweep").glob("*/result.json"))
    assert run.main(args) == 0 and f"{runs[1]} from step 5" in capsys.readouterr().out
    for workdir in runs:
        assert json.loads((workdir / "result.json").read_text())["status"] == "done" and latest(workdir) == 12


def test_preempting_one_of_two_processes_stops_both_at_one_step(tmp_path):
    """2 processes x 1 device; SIGTERM to process 1 alone: both stop at the same log step with exit 75 and the
    checkpoint they write together restores in this process at that step."""
    from test_multiprocess import TIMEOUT_S, outputs, start_on_loopback

    flags = [*FLAGS, "--config.train.steps=100000", "--config.train.log_every=5", "--config.train.eval_every=0"]
    flags += ["--config.train.checkpoint_every=100000", "--config.mesh.data=2"]
    procs, logs = start_on_loopback(flags, tmp_path / "run", devices_per_process=1)
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while "[train] step" not in logs[0].read_text():  # both are training
            assert time.monotonic() < deadline and procs[0].poll() is None, outputs(procs, logs)
            time.sleep(0.2)
        procs[1].send_signal(signal.SIGTERM)
        codes = [p.wait(timeout=TIMEOUT_S) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert codes == [75, 75], outputs(procs, logs)
    lines = [log.read_text().strip().splitlines()[-1] for log in logs]
    step = latest(tmp_path / "run")
    assert step % 5 == 0 and lines == [
        STOPPED.format("a signal to another process", step),
        STOPPED.format("SIGTERM", step),
    ], outputs(procs, logs)
    assert load_workdir(tmp_path / "run").step == step
