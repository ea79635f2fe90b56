"""The in-process sweep: every run of a sweep file trained in this process, one vmapped group after another.

python run.py sweep --sweep=experiments/ablations/NAME.py --workdir=DIR [--no-vmap] [--config.a.b=v ...]

DIR/results.csv, results.md and results.png (txjax.sweep.report) are rewritten after every group. Running the same
command again skips the runs that are done and resumes the others from their checkpoints (a failed run trains again), so
a failed run, a crash, SIGTERM or Ctrl-C (the run in training saves its current step: txjax.ops.preemption) leaves a
sweep that one more command finishes; one sweep at a time writes DIR (txjax.ops.workdir_lock). Runs that differ only in
the seed and the optimizer's scalar settings are trained together under jax.vmap (txjax.training.stack) unless
--no-vmap. An optuna search asks Optuna for one point at a time and tells it the point's mean final metric
(txjax.sweep.search); its rerun asks the same seeded sampler again and gets the same points, whose finished runs it
skips; a point it proposes again is told its first value and not trained twice. A scheduler (early stopping) needs
Ray (--launcher=ray, txjax.sweep.ray_launcher): here every run trains to the end. With W&B or MLflow among
train.trackers, the runs join one group (W&B's group; an MLflow parent run holding the sweep's spec and, at the end,
its report: tracked, txjax.ops.trackers).
"""

from __future__ import annotations

import contextlib
import json
import math
import time
import traceback
from pathlib import Path

from txjax.evaluate.probes import run_probes
from txjax.extras import require
from txjax.ops import preemption, trackers, workdir_lock
from txjax.ops.storage import StorageError
from txjax.ops.workdir_lock import Busy
from txjax.sweep import search as search_lib
from txjax.sweep.report import REPORT_FILES, final_metric, write_report
from txjax.sweep.spec import SweepRun, claim, deduplicate, expand, finish, make_run, read_result
from txjax.training.edge import group_key
from txjax.training.stack import train_runs


def run_sweep(
    sweep: dict, workdir: str | Path, overrides: list[str], vmap: bool = True, command: str = ""
) -> list[SweepRun]:
    """Trains every run of the sweep that has no result yet, then writes the report; returns the runs."""
    workdir = Path(workdir)
    optuna = (sweep["search"] or {}).get("kind") == "optuna"
    runs = [] if optuna else expand(sweep, overrides, workdir)
    with workdir_lock.hold(workdir), preemption.watch():  # SIGTERM/SIGINT: the current run saves, the sweep stops
        claim(workdir, sweep, overrides)
        if sweep["scheduler"]:
            print("note: the scheduler stops runs early with --launcher=ray only; here every run trains to the end")
        with tracked(sweep, overrides, workdir):
            if optuna:
                return _optuna(sweep, workdir, overrides, vmap, command)
            train_all(sweep, workdir, runs, vmap, command)
            return runs


@contextlib.contextmanager
def tracked(sweep: dict, overrides: list[str], workdir: Path):
    """While inside, the sweep's tracker group is open (txjax.ops.trackers.open_sweep, for the trackers of its base
    config); on the way out its MLflow parent run ends with the report as artifacts (stopped by a signal, failed by
    an error)."""
    base = make_run(sweep, overrides, workdir, {}).config
    trackers.open_sweep(workdir, base.train.trackers if base else (), sweep)
    status = "failed"
    try:
        yield
        status = "finished"
    except (preemption.Preempted, KeyboardInterrupt):
        status = "stopped"
        raise
    finally:
        trackers.close_sweep(workdir, status, [workdir / name for name in REPORT_FILES])


def train_all(sweep: dict, workdir: Path, runs: list[SweepRun], vmap: bool, command: str, shown=None) -> None:
    """Trains the runs of `runs` without a result, group by group, rewriting the report (of `shown`, default
    `runs`) after each."""
    shown = runs if shown is None else shown
    todo = pending(runs)
    groups = groups_of(todo) if vmap else [[r] for r in todo]
    print(
        f"sweep {workdir}: {len(runs)} runs, {len(runs) - len(todo)} finished, {len(todo)} to train in "
        f"{len(groups)} program(s)",
        flush=True,
    )
    try:
        for group in groups:
            preemption.raise_if_signalled()
            train_group(group, sweep["probes"])
            write_report(workdir, shown, sweep["metrics"], command, sweep["lines"])
    except BaseException:
        with contextlib.suppress(StorageError):  # the report of the runs so far; the error on its way says why not
            write_report(workdir, shown, sweep["metrics"], command, sweep["lines"])
        raise
    if not groups:
        write_report(workdir, shown, sweep["metrics"], command, sweep["lines"])


def _optuna(sweep: dict, workdir: Path, overrides: list[str], vmap: bool, command: str) -> list[SweepRun]:
    """num_samples points asked of a seeded Optuna study one at a time, each told its runs' mean final metric."""
    optuna = require("optuna", "a sweep's optuna search")
    search, metric = sweep["search"], objective_metric(sweep)
    study = optuna.create_study(direction="minimize", sampler=search_lib.optuna_sampler(search))
    space, runs, known, drawn = search_lib.optuna_space(search["space"]), [], {}, {}
    for _ in range(search["num_samples"]):
        trial = study.ask(space)
        key = json.dumps(trial.params, sort_keys=True)
        if key in drawn:  # proposed again: the same runs, told the same value
            point = drawn[key]
            deduplicate(expand(sweep, overrides, workdir, [trial.params]), known)
        else:
            point = drawn[key] = deduplicate(expand(sweep, overrides, workdir, [trial.params]), known)
            runs += point
            train_all(sweep, workdir, point, vmap, command, shown=runs)
        value = final_metric(point, metric)
        if math.isfinite(value):
            study.tell(trial, value)
        else:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
    return runs


def objective_metric(sweep: dict) -> str:
    """What a search minimizes and a scheduler compares: the scheduler's metric, else valid_loss."""
    return (sweep["scheduler"] or {}).get("metric", "valid_loss")


FINISHED = ("done", "stopped")  # a result a rerun keeps (stopped: early, by a scheduler); a failed run trains again


def pending(runs: list[SweepRun]) -> list[SweepRun]:
    """The runs still to train (none yet, or failed): each run's result.json is read; a run without a config (a bad
    setting) fails."""
    for run in runs:
        run.result = read_result(run.workdir)
    todo = [r for r in runs if r.result.get("status") not in FINISHED]
    for run in todo:
        if run.error:
            finish(run, {"status": "failed", "error": run.error})
    return [r for r in todo if not r.error]


def groups_of(runs: list[SweepRun]) -> list[list[SweepRun]]:
    """Runs that can share one vmapped program, in order of first appearance."""
    groups: dict[str, list[SweepRun]] = {}
    for run in runs:
        groups.setdefault(group_key(run.config) or run.name, []).append(run)
    return list(groups.values())


def train_group(group: list[SweepRun], probes: list[str]) -> None:
    """Trains a group (txjax.training.stack.train_runs: one run, or one vmapped program), then probes each run;
    records the outcome of every run in its result.json. An error fails the runs it hits, not the sweep; a run that
    another process is training (its writer lock is held) is left to that process, which writes its result."""
    began = time.monotonic()
    try:
        with trackers.in_sweep({r.workdir: r.settings for r in group}):  # their tracker runs join the sweep's group
            outcomes = train_runs([r.config for r in group], [r.workdir for r in group])
    except Busy as e:
        print(f"[sweep] {', '.join(r.name for r in group)}: left to its trainer ({e})", flush=True)
        return
    except Exception as e:  # noqa: BLE001 -- a failed program fails its runs and the sweep goes on
        traceback.print_exc()
        outcomes = [e] * len(group)
    wall_s = time.monotonic() - began
    for run, outcome in zip(group, outcomes):
        result = {"status": "failed", "error": f"{type(outcome).__name__}: {outcome}"}
        if not isinstance(outcome, Exception):
            try:
                result = {"status": "done", **run_probes(probes, run.workdir)}
            except Exception as e:  # noqa: BLE001
                traceback.print_exc()
                result = {"status": "failed", "error": f"probe: {type(e).__name__}: {e}"}
        finish(run, {**result, "wall_s": wall_s, "runs_vmapped": len(group)})
