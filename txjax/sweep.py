"""Sweeps: one base experiment, a grid of settings, one run folder per setting, a results table and a plot.

A sweep file `experiments/ablations/NAME.py` defines get_sweep() -> dict with the keys
    experiment  the base experiment file (a path relative to the repo root)
    fixed       {field: value} set in every run, e.g. {"train.steps": 1000}
    grid        {field: [values]}: every combination is a setting
    zip         {field: [values]} of equal lengths, varied together and crossed with the grid (optional)
    seeds       [train.seed values], crossed with every setting (default [0])
    metrics     the results the plot shows as bars per setting (default ["valid_loss"])
    probes      measurements after training (txjax.probes), their results join the table (default [])
    lines       {"x": field, "series": field, "panels": field (optional)}: also results_lines.png, the first
                metric's mean over seeds against x (log scale), one line per series value, one panel per panels
                value, and results.md's best x per line (e.g. loss against learning rate per width, muP)
A field is written as on the command line without `--config.`: "model.attention_scale". A run's config is the
experiment file, then `fixed`, then the command line's --config.* flags, then its own settings.

    python run.py sweep --sweep=experiments/ablations/NAME.py --workdir=DIR [--no-vmap] [--config.a.b=v ...]

DIR/<run name>/ is an ordinary run folder plus `result.json` (status done | failed, error, wall time), written when
the run ends; DIR/results.csv, results.md and results.png are rewritten after every run. Running the same command
again skips the runs that have a result.json and resumes the others from their checkpoints, so a failed run, a
crash, SIGTERM or Ctrl-C (the run in training saves its current step: txjax.preemption) leaves a sweep that one
more command finishes; one sweep at a time writes DIR (txjax.workdir_lock). Runs that differ only in the seed and the
optimizer's scalar settings are trained together under jax.vmap (txjax.training.stack) unless --no-vmap.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import ml_collections

from txjax import config as config_lib
from txjax import preemption, workdir_lock
from txjax.probes import run_probes
from txjax.sweep_report import fmt, short, write_report
from txjax.training.stack import group_key, train_runs

RESULT_FILE = "result.json"
SWEEP_FILE = "sweep.json"
_KEYS = {"experiment", "fixed", "grid", "zip", "seeds", "metrics", "probes", "lines"}


@dataclass
class SweepRun:
    """One point of the sweep: its settings (seed included), its folder, and its config or why it has none."""

    name: str
    settings: dict
    workdir: Path
    config: ml_collections.ConfigDict | None = None
    error: str = ""
    result: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        """The setting without the seed: runs with equal labels are repeats over seeds."""
        return ", ".join(f"{short(k)}={fmt(v)}" for k, v in self.settings.items() if k != "train.seed") or "base"


def load_sweep(path: str | Path) -> dict:
    """get_sweep() of a sweep file, checked: known keys, an experiment, zip lists of equal length."""
    path = Path(path)
    if not path.is_file():
        raise config_lib.ConfigError(f"sweep file not found: {path.resolve()}")
    spec = importlib.util.spec_from_file_location(f"sweep_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sweep = {
        "fixed": {},
        "grid": {},
        "zip": {},
        "seeds": [0],
        "metrics": ["valid_loss"],
        "probes": [],
        "lines": None,
        **module.get_sweep(),
    }
    unknown = set(sweep) - _KEYS
    if unknown:
        raise config_lib.ConfigError(
            f"{path}: unknown sweep key(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(_KEYS))}"
        )
    if "experiment" not in sweep:
        raise config_lib.ConfigError(f"{path}: get_sweep() must name its base 'experiment' file")
    if len({len(v) for v in sweep["zip"].values()}) > 1:
        raise config_lib.ConfigError(f"{path}: the zip axes {', '.join(sweep['zip'])} must have equal lengths")
    return sweep


def expand(sweep: dict, overrides: list[str], workdir: Path) -> list[SweepRun]:
    """Every run of the sweep, in grid order (seeds innermost), each with its validated config or its error."""
    clash = [f for f in overrides if f.removeprefix("--config.").partition("=")[0] in _axes(sweep)]
    if clash:
        raise config_lib.ConfigError(f"{' '.join(clash)}: the sweep varies this field; edit the sweep file instead")
    grid = [dict(zip(sweep["grid"], values)) for values in itertools.product(*sweep["grid"].values())]
    zipped = [dict(zip(sweep["zip"], values)) for values in zip(*sweep["zip"].values())] or [{}]
    runs = []
    for point, together, seed in itertools.product(grid, zipped, sweep["seeds"]):
        settings = {**point, **together, "train.seed": seed}
        name = "_".join(f"{short(k)}-{fmt(v)}" for k, v in settings.items()).replace("/", "-")
        run = SweepRun(name, settings, workdir / name)
        try:
            run.config = _config(sweep, overrides, settings)
        except config_lib.ConfigError as e:
            run.error = str(e)
        runs.append(run)
    return runs


def _axes(sweep: dict) -> list[str]:
    return [*sweep["grid"], *sweep["zip"], "train.seed"]


def _config(sweep: dict, overrides: list[str], settings: dict) -> ml_collections.ConfigDict:
    config = config_lib.load_config(config_lib.REPO / sweep["experiment"])
    flags = [f"--config.{k}={v}" for k, v in sweep["fixed"].items()] + overrides
    flags += [f"--config.{k}={v}" for k, v in settings.items()]
    for flag in flags:
        config_lib.apply_override(config, flag)
    config_lib.validate(config)
    return config


def run_sweep(
    sweep: dict, workdir: str | Path, overrides: list[str], vmap: bool = True, command: str = ""
) -> list[SweepRun]:
    """Trains every run of the sweep that has no result yet, then writes the report; returns the runs."""
    workdir = Path(workdir)
    runs = expand(sweep, overrides, workdir)
    with workdir_lock.hold(workdir), preemption.watch():  # SIGTERM/SIGINT: the current run saves, the sweep stops
        return _run_all(sweep, workdir, overrides, runs, vmap, command)


def _run_all(sweep: dict, workdir: Path, overrides: list[str], runs: list[SweepRun], vmap: bool, command: str):
    _claim(workdir, sweep, overrides)
    for run in runs:
        run.result = _read_result(run.workdir)
    todo = [r for r in runs if not r.result]
    for run in todo:
        if run.error:  # no config: a bad setting
            _finish(run, {"status": "failed", "error": run.error})
    todo = [r for r in todo if not r.error]
    groups = _groups(todo) if vmap else [[r] for r in todo]
    print(
        f"sweep {workdir}: {len(runs)} runs, {len(runs) - len(todo)} finished, {len(todo)} to train in "
        f"{len(groups)} program(s)",
        flush=True,
    )
    try:
        for group in groups:
            preemption.raise_if_signalled()
            _train(group, sweep["probes"])
            write_report(workdir, runs, sweep["metrics"], command, sweep["lines"])
    finally:
        write_report(workdir, runs, sweep["metrics"], command, sweep["lines"])
    return runs


def _claim(workdir: Path, sweep: dict, overrides: list[str]) -> None:
    """Writes DIR/sweep.json, or checks that DIR holds the same sweep (so finished runs mean the same thing)."""
    identity = {"sweep": sweep, "overrides": overrides}
    path = workdir / SWEEP_FILE
    if path.is_file() and json.loads(path.read_text()) != json.loads(json.dumps(identity)):
        raise config_lib.ConfigError(f"{workdir} holds a different sweep (see {path}); choose another --workdir")
    workdir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(identity, indent=1) + "\n")


def _groups(runs: list[SweepRun]) -> list[list[SweepRun]]:
    """Runs that can share one vmapped program, in order of first appearance."""
    groups: dict[str, list[SweepRun]] = {}
    for run in runs:
        groups.setdefault(group_key(run.config) or run.name, []).append(run)
    return list(groups.values())


def _train(group: list[SweepRun], probes: list[str]) -> None:
    """Trains a group (txjax.training.stack.train_runs: one run, or one vmapped program), then probes each run;
    records the outcome of every run in its result.json. An error fails the runs it hits, not the sweep."""
    began = time.monotonic()
    try:
        outcomes = train_runs([r.config for r in group], [r.workdir for r in group])
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
        _finish(run, {**result, "wall_s": wall_s, "runs_vmapped": len(group)})


def _finish(run: SweepRun, result: dict) -> None:
    run.workdir.mkdir(parents=True, exist_ok=True)
    (run.workdir / RESULT_FILE).write_text(json.dumps(result, indent=1) + "\n")
    run.result = result
    print(
        f"[sweep] {run.name}: {result['status']}" + (f" ({result['error']})" if result.get("error") else ""), flush=True
    )


def _read_result(workdir: Path) -> dict:
    path = workdir / RESULT_FILE
    return json.loads(path.read_text()) if path.is_file() else {}
