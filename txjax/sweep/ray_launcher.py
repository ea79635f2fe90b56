"""A sweep on Ray Tune: each trial trains one group of the sweep's runs with txjax's own loop, where Ray places it.

    python run.py sweep --sweep=FILE --workdir=DIR --launcher=ray [--address=auto|HOST:PORT]
        [--run_resources='{"CPU": 1}'] [--max_concurrent=N]

A trial is a vmapped group of the in-process sweep (txjax.sweep.local.groups_of; one run with --no-vmap); with a
scheduler or an optuna search, one setting and its seeds (what the scheduler compares and the search is told: their
mean). The trial calls txjax.sweep.local.train_group, as the in-process sweep does, so the run folders
DIR/<run>/ (checkpoints, metrics, result.json) are those of an in-process sweep and its report is the same; DIR
must be on storage every node reads and writes at the same path (a shared filesystem), as must the repository.
Each eval the loop logs (txjax.ops.metrics_log.observe) is reported to Tune as {"step", "valid_<metric>"}, the mean
over the trial's runs, once every run of the trial has logged that step.

Early stopping is Tune's ASHAScheduler on "step": a stopped trial's process ends where it reported; its runs keep
their last checkpoint, and the driver writes their result.json with status "stopped" and that step. Faults: a trial
whose process dies (SIGKILL, a lost node) is retried up to --max_failures times (tune.FailureConfig) and train_runs
resumes each run from its last txjax checkpoint, so it ends as an uninterrupted run would (bit for bit on CPU). A
killed driver: the same command starts a new Tune experiment of the runs not yet finished, as the in-process sweep
trains its pending runs (txjax's rerun, not Tune's restore; none at all when every run is finished). SIGINT or
SIGTERM to the driver (txjax.ops.preemption) writes DIR/stop.request; every trial polls it, its runs save their
current step and stop, trials not yet started end at once, and the command ends as an interrupted in-process sweep
does. With W&B or MLflow among train.trackers, the driver opens the sweep's group (txjax.sweep.local.tracked) and
each worker's runs join it from DIR/trackers.json (train_group).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np

from txjax import config as config_lib
from txjax.extras import require
from txjax.ops import metrics_log, preemption, workdir_lock
from txjax.sweep import search as search_lib
from txjax.sweep.local import groups_of, objective_metric, pending, tracked, train_group
from txjax.sweep.report import final_metric, write_report
from txjax.sweep.spec import SweepRun, claim, expand, finish, make_run, read_result

CONNECT_TIMEOUT_S = 10  # for a Ray cluster's HOST:PORT to answer
STOP_FILE = "stop.request"  # in DIR: the driver's "save and stop" to every trial
TUNE_DIR = "tune"  # in DIR: Tune's experiment state and trial logs


def run_on_ray(
    sweep: dict,
    workdir: str | Path,
    overrides: list[str],
    vmap: bool = True,
    command: str = "",
    address: str | None = None,
    resources: dict | None = None,
    max_concurrent: int = 0,
    max_failures: int = 3,
) -> list[SweepRun]:
    """Trains every run of the sweep without a result as Ray Tune trials, then writes the report; returns the runs
    (for an optuna search, those of the points Tune's OptunaSearch proposed)."""
    ray, tune = require("ray", "run.py sweep --launcher=ray"), require("ray.tune", "run.py sweep --launcher=ray")
    workdir = Path(workdir).resolve()
    optuna = (sweep["search"] or {}).get("kind") == "optuna"
    runs = [] if optuna else expand(sweep, overrides, workdir)
    if not ray.is_initialized():  # before watch: a signal while connecting stops the command at once
        connect(ray, address)
    with workdir_lock.hold(workdir), preemption.watch():  # a signal: every trial saves and stops
        claim(workdir, sweep, overrides)
        (workdir / STOP_FILE).unlink(missing_ok=True)
        os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"  # preemption.watch's handler, not Tune's, takes Ctrl-C
        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # the live table of CLIReporter, one line per trial
        todo = pending(runs)  # reads every result.json; a run with a bad setting fails here, once
        plan = {} if optuna else _trials(todo, vmap, sweep["scheduler"] is not None)  # no trial of a finished run
        shown = _Shown(sweep, overrides, workdir, runs, plan)
        trainable = tune.with_parameters(_trial, sweep=sweep, overrides=overrides, workdir=workdir, plan=plan)
        if resources:
            trainable = tune.with_resources(trainable, tune.PlacementGroupFactory([resources]))
        tuner = tune.Tuner(
            trainable,
            param_space={"trial": tune.grid_search(list(plan))} if plan else {},
            tune_config=_tune_config(sweep, max_concurrent, runs),
            run_config=tune.RunConfig(
                name="sweep",
                storage_path=str(workdir / TUNE_DIR),
                failure_config=tune.FailureConfig(max_failures=max_failures),
                callbacks=[_Driver(shown, workdir, command)],
                progress_reporter=tune.CLIReporter(
                    metric_columns=["step", objective_metric(sweep)], max_report_frequency=30
                ),
                verbose=1,
            ),
        )
        print(f"sweep {workdir}: {len(runs) or sweep['search']['num_samples']} runs or points, {len(plan)} trials")
        with tracked(sweep, overrides, workdir):  # the trials' runs join its group (train_group: in_sweep)
            try:
                if plan or optuna:  # else every run is finished: no Tune experiment, no trial's process to start
                    tuner.fit()
            finally:
                (workdir / STOP_FILE).unlink(missing_ok=True)
                for run in shown.runs:
                    run.result = read_result(run.workdir)
                write_report(workdir, shown.runs, sweep["metrics"], command, sweep["lines"])
            preemption.raise_if_signalled()
        return shown.runs


def connect(ray, address: str | None) -> None:
    """ray.init: a new local cluster (address None), the one `ray start` left here (auto), or HOST:PORT, where a Ray
    GCS must answer within CONNECT_TIMEOUT_S, first a TCP connection, then (unless it answers in text, as a web
    server does: _answers_in_text) a request of Ray's own GCS client (ray.init itself would retry for minutes, also
    where something else listens there); a cluster not found is one ConfigError line naming the address."""
    fix = "start one with `ray start --head` (on HOST), or drop --address to start one in this command"
    host, _, port = (address or "").rpartition(":")
    if address and address != "auto" and not address.startswith("ray://"):
        try:
            with socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S) as connection:
                text = _answers_in_text(connection)
        except (OSError, ValueError) as e:
            reason = "not HOST:PORT" if isinstance(e, ValueError) else e.strerror or type(e).__name__
            raise config_lib.ConfigError(
                f"--address={address}: no Ray cluster answers there ({reason}); {fix}"
            ) from None
        if text or not _gcs_answers(address):
            raise config_lib.ConfigError(
                f"--address={address}: something answers there, but not a Ray cluster's GCS (the port of "
                f"`ray start --head --port=PORT`, 6379 by default); {fix}"
            )
    try:
        ray.init(address=address, include_dashboard=False, runtime_env={"env_vars": _worker_env()})
    except ConnectionError as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise config_lib.ConfigError(f"--address={address}: {reason.rstrip('.')}; {fix}") from None


def _answers_in_text(connection: socket.socket) -> bool:
    """Whether the server answers the HTTP/2 preface, which a gRPC client (Ray's GCS client too) sends first, in
    text: an HTTP/1 server's status line or error page, another service's banner; never a GCS, whose gRPC answers in
    binary frames (HTTP/2's SETTINGS, or TLS records). Told at once where Ray's client would wait 10 s
    (_gcs_answers); a binary answer, or none within a second, leaves it to Ray's client."""
    try:
        connection.settimeout(1)
        connection.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        reply = connection.recv(16)
    except OSError:
        return False
    return bool(reply) and all(32 <= byte < 127 or byte in b"\t\r\n" for byte in reply)


def _gcs_answers(address: str) -> bool:
    """Whether a Ray GCS at HOST:PORT answers Ray's own GCS client (its cluster id) within CONNECT_TIMEOUT_S: asked in
    a child process, whose stderr takes the client's log line of each failed try (the user sees one line) and which
    is ended if the client waits longer. The client first waits for two connections (its channel, its pubsub) up to
    RAY_gcs_rpc_server_connect_timeout_s each (5 s by default), then for the answer: 3 + 3 + 4 s here."""
    client = f"InnerGcsClient.standalone({address!r}, None, {(CONNECT_TIMEOUT_S - 6) * 1000})"
    env = {**os.environ, "RAY_gcs_rpc_server_connect_timeout_s": "3"}
    probe = [sys.executable, "-c", f"from ray._raylet import InnerGcsClient; {client}"]
    try:
        done = subprocess.run(probe, capture_output=True, env=env, timeout=2 * CONNECT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


def _worker_env() -> dict:
    """The trials' environment: the repository importable (experiment files, txjax), the driver's persistent
    compilation cache, so that trials of one program compile it once, and its trackers' settings (WANDB_*, MLFLOW_*:
    where the runs log, txjax.ops.trackers)."""
    import jax

    env = {k: v for k, v in os.environ.items() if k.startswith(("WANDB_", "MLFLOW_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(config_lib.REPO), os.environ.get("PYTHONPATH")]))
    if jax.config.jax_compilation_cache_dir:
        env["JAX_COMPILATION_CACHE_DIR"] = str(jax.config.jax_compilation_cache_dir)
    if jax.config.jax_platforms:  # the driver's backends (txjax.parallel.platforms: no absent TPU's start-up)
        env["JAX_PLATFORMS"] = jax.config.jax_platforms
    return env


def _trials(runs: list[SweepRun], vmap: bool, per_setting: bool) -> dict[str, list[tuple[str, dict]]]:
    """{trial name: the names and settings of its runs}: of `runs` (those still to train), the vmapped groups (or
    single runs), or with a scheduler each setting's seeds (vmapped together, or each alone); a trial is named after
    its first run."""
    if per_setting:
        by_label: dict[str, list[SweepRun]] = {}
        for run in runs:
            by_label.setdefault(run.label, []).append(run)
        groups = [g for runs_of in by_label.values() for g in (groups_of(runs_of) if vmap else [[r] for r in runs_of])]
    else:
        groups = groups_of(runs) if vmap else [[r] for r in runs]
    if per_setting:  # ASHA judges a trial against those that reached its rung before: in grid order (say rates
        # ascending) every one would beat the last and go on, so the trials start in a seeded random order
        groups = [groups[i] for i in np.random.default_rng(0).permutation(len(groups))]
    return {
        group[0].name + (f" +{len(group) - 1}" if len(group) > 1 else ""): [(r.name, r.settings) for r in group]
        for group in groups
    }


def _tune_config(sweep: dict, max_concurrent: int, runs: list[SweepRun]):
    tune = require("ray.tune", "run.py sweep --launcher=ray")
    metric, search, scheduler = objective_metric(sweep), sweep["search"], sweep["scheduler"]
    search_alg, num_samples = None, 1
    if search and search["kind"] == "optuna":
        from ray.tune.search import ConcurrencyLimiter
        from ray.tune.search.optuna import OptunaSearch

        optuna_search = OptunaSearch(
            space=search_lib.optuna_space(search["space"]), sampler=search_lib.optuna_sampler(search)
        )
        search_alg = ConcurrencyLimiter(optuna_search, max_concurrent) if max_concurrent else optuna_search
        num_samples = search["num_samples"]
    asha = None
    if scheduler:
        steps = max([r.config.train.steps for r in runs if r.config] or [sweep["fixed"].get("train.steps", 1)])
        asha = tune.schedulers.ASHAScheduler(
            time_attr="step",
            max_t=steps + 1,  # ASHA stops a trial at max_t: past the last eval, which the run itself ends at
            grace_period=int(scheduler.get("grace_steps", 1)),
            reduction_factor=float(scheduler.get("reduction_factor", 3)),
        )
    return tune.TuneConfig(
        metric=metric,
        mode="min",
        search_alg=search_alg,
        scheduler=asha,
        num_samples=num_samples,
        max_concurrent_trials=max_concurrent or None,
        trial_dirname_creator=lambda trial: f"trial_{trial.trial_id}",
    )


class _Shown:
    """The runs the report shows: the planned ones, or an optuna search's as Tune proposes them."""

    def __init__(self, sweep: dict, overrides: list[str], workdir: Path, runs: list[SweepRun], plan: dict):
        self.sweep, self.overrides, self.workdir, self.runs, self.plan = sweep, overrides, workdir, runs, plan

    def of(self, config: dict) -> list[SweepRun]:
        """The runs of a trial's config (the plan's, or an optuna point with the sweep's seeds), known from now."""
        names = {r.name: r for r in self.runs}
        settings = _settings(config, self.sweep, self.plan)
        trial_runs = [make_run(self.sweep, self.overrides, self.workdir, s, n) for n, s in settings]
        for run in trial_runs:
            if run.name in names and "trial" not in config:  # an optuna point proposed again
                names[run.name].draws += 1
        self.runs += [r for r in trial_runs if r.name not in names]
        return [names.get(r.name, r) for r in trial_runs]


def _settings(config: dict, sweep: dict, plan: dict[str, list[tuple[str, dict]]]) -> list[tuple[str | None, dict]]:
    """The names and settings of a trial's runs: the plan's for a planned trial, an optuna point crossed with the
    seeds (named by make_run)."""
    if "trial" in config:
        return plan[config["trial"]]
    point = {k: v.item() if isinstance(v, np.generic) else v for k, v in config.items()}
    return [(None, {**point, "train.seed": seed}) for seed in sweep["seeds"]]


def _trial(config: dict, sweep: dict, overrides: list[str], workdir: Path, plan: dict) -> None:
    """One Tune trial, in a Ray worker: trains its runs without a result (train_group), reporting each eval."""
    from ray import tune

    runs = [make_run(sweep, overrides, workdir, s, n) for n, s in _settings(config, sweep, plan)]
    if (workdir / STOP_FILE).exists():  # the driver is stopping: the next command trains these
        return
    todo = pending(runs)
    reporter = _Reporter(todo, tune.report)
    if todo:
        with metrics_log.observe(reporter), _stop_on_request(workdir / STOP_FILE):
            try:
                train_group(todo, sweep["probes"])
            except preemption.Preempted:
                return
    if not reporter.reported:  # nothing trained here (every run finished before): their final metrics
        metric = objective_metric(sweep)
        steps = max(r.config.train.steps for r in runs if r.config) if any(r.config for r in runs) else 0
        tune.report({"step": steps, metric: final_metric(runs, metric)})


class _Reporter:
    """metrics_log.observe's callable: once every run of the trial logged an eval of a step, tune.report the step
    and the mean of each valid metric over the runs."""

    def __init__(self, runs: list[SweepRun], report):
        self.folders, self.report = {r.workdir.resolve() for r in runs}, report
        self.evals: dict[int, dict[Path, dict]] = {}
        self.reported = False

    def __call__(self, workdir: Path, step: int, split: str, record: dict) -> None:
        if split != "valid" or Path(workdir).resolve() not in self.folders:
            return
        at_step = self.evals.setdefault(step, {})
        at_step[Path(workdir).resolve()] = record
        if len(at_step) == len(self.folders):
            keys = set.intersection(*(set(r) for r in at_step.values()))
            means = {f"valid_{k}": float(np.mean([r[k] for r in at_step.values()])) for k in sorted(keys)}
            self.reported = True
            self.report({"step": step, **means})


class _stop_on_request:
    """While inside, a thread polls `path` (the driver's STOP_FILE) and, once it exists, asks the loop to stop
    (preemption.request: the runs save their current step)."""

    def __init__(self, path: Path):
        self.path, self.done = path, threading.Event()

    def _poll(self) -> None:
        while not self.done.wait(0.5):
            if self.path.exists():
                preemption.request("a signal to the sweep's driver")
                return

    def __enter__(self):
        threading.Thread(target=self._poll, daemon=True).start()

    def __exit__(self, *exc):
        self.done.set()


class _Driver(require("ray.tune", "run.py sweep --launcher=ray").Callback):
    """Tune's callback in the driver: a signal becomes the stop file; a trial's end writes the result.json of its
    runs that the scheduler stopped (status "stopped", the step reported last) and rewrites the report."""

    def __init__(self, shown: _Shown, workdir: Path, command: str):
        self.shown, self.workdir, self.command = shown, workdir, command

    def on_step_begin(self, iteration, trials, **info):
        if preemption.received() and not (self.workdir / STOP_FILE).exists():
            print(f"{preemption.received()}: every trial saves its step and stops", flush=True)
            (self.workdir / STOP_FILE).write_text(json.dumps({"signal": preemption.received()}) + "\n")

    def on_trial_complete(self, iteration, trials, trial, **info):
        runs = self.shown.of(trial.config)
        for run in runs:
            run.result = read_result(run.workdir)
            if not run.result and not preemption.received() and trial.last_result.get("step") is not None:
                finish(run, {"status": "stopped", "step": trial.last_result["step"]})
        sweep = self.shown.sweep
        write_report(self.workdir, self.shown.runs, sweep["metrics"], self.command, sweep["lines"])
