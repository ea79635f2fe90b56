"""A sweep file, checked and expanded into runs: one base experiment, settings, one run folder per setting.

A sweep file `experiments/ablations/NAME.py` defines get_sweep() -> dict with the keys
    experiment  the base experiment file (a path relative to the repo root)
    fixed       {field: value} set in every run, e.g. {"train.steps": 1000}
    grid        {field: [values]}: every combination is a setting
    zip         {field: [values]} of equal lengths, varied together and crossed with the grid (optional)
    seeds       [train.seed values], crossed with every setting (default [0])
    search      sampled settings (txjax.sweep.search): {"kind": "random" | "optuna", "num_samples": N, "seed": S,
                "space": {field: ("loguniform", lo, hi) | ("uniform", lo, hi) | ("choice", [values]) |
                ("randint", lo, hi)}}; random samples are crossed with grid and zip, optuna takes neither
    scheduler   early stopping on Ray (txjax.sweep.ray_launcher): {"kind": "asha", "metric": "valid_loss",
                "grace_steps": G, "reduction_factor": 3}; an in-process sweep trains every run to the end
    metrics     the results the plot shows as bars per setting (default ["valid_loss"])
    probes      measurements after training (txjax.evaluate.probes), their results join the table (default [])
    lines       {"x": field, "series": field, "panels": field (optional)}: also results_lines.png, the first
                metric's mean over seeds against x (log scale), one line per series value, one panel per panels
                value, and results.md's best x per line (e.g. loss against learning rate per width, muP)
A field is written as on the command line without `--config.`: "model.attention_scale". A run's config is the
experiment file, then `fixed`, then the command line's --config.* flags, then its own settings. Everything is
checked here, before any run starts: a bad key, field or distribution is one ConfigError line.

A run's name is its settings (`lr-0.001_seed-0`), unique by construction: a setting a search draws again is one run
(its `draws` counts the repeats, and the report says so); different settings whose names would collide (values equal
to fmt's 6 digits) are named apart by a digest of their exact values.

DIR/<run name>/ is an ordinary run folder plus `result.json` (status done | failed | stopped, error, wall time),
written when the run ends; a rerun of the sweep skips the runs done or stopped (by a scheduler) and trains the
failed ones again.
"""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path

import ml_collections

from txjax import config as config_lib
from txjax.ops import storage
from txjax.sweep import search as search_lib
from txjax.sweep.report import fmt, short

RESULT_FILE = "result.json"
SWEEP_FILE = "sweep.json"
_KEYS = {"experiment", "fixed", "grid", "zip", "seeds", "search", "scheduler", "metrics", "probes", "lines"}
_SCHEDULER_KEYS = {"kind", "metric", "grace_steps", "reduction_factor"}


@dataclass
class SweepRun:
    """One point of the sweep: its settings (seed included), its folder, and its config or why it has none."""

    name: str
    settings: dict
    workdir: Path
    config: ml_collections.ConfigDict | None = None
    error: str = ""
    result: dict = field(default_factory=dict)
    draws: int = 1  # how many times the sweep's search drew this setting (it trains once)

    @property
    def label(self) -> str:
        """The setting without the seed: runs with equal labels are repeats over seeds."""
        return ", ".join(f"{short(k)}={fmt(v)}" for k, v in self.settings.items() if k != "train.seed") or "base"


def load_sweep(path: str | Path) -> dict:
    """get_sweep() of a sweep file, checked: known keys, an experiment, zip lists of equal length, a search space
    and scheduler that parse, fields the experiment's config has."""
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
        "search": None,
        "scheduler": None,
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
    if sweep["search"] is not None:
        search_lib.check_section(sweep["search"], path)
        if sweep["search"]["kind"] == "optuna" and (sweep["grid"] or sweep["zip"]):
            raise config_lib.ConfigError(f"{path}: an optuna search takes no grid or zip; put them in its space")
    if sweep["scheduler"] is not None:
        _check_scheduler(sweep["scheduler"], path)
    _check_fields(sweep, path)
    return sweep


def _check_scheduler(scheduler: dict, path: Path) -> None:
    if not isinstance(scheduler, dict) or scheduler.get("kind") != "asha" or set(scheduler) - _SCHEDULER_KEYS:
        raise config_lib.ConfigError(
            f"{path}: scheduler must be {{'kind': 'asha', 'metric': 'valid_loss', 'grace_steps': G, "
            f"'reduction_factor': 3}} (keys {', '.join(sorted(_SCHEDULER_KEYS))}); got {scheduler!r}"
        )
    if not str(scheduler.get("metric", "valid_loss")).startswith("valid_"):
        raise config_lib.ConfigError(f"{path}: the scheduler's metric must be an eval's, e.g. valid_loss")
    if int(scheduler.get("grace_steps", 1)) < 1 or float(scheduler.get("reduction_factor", 3)) <= 1:
        raise config_lib.ConfigError(f"{path}: the scheduler needs grace_steps >= 1 and reduction_factor > 1")


def _check_fields(sweep: dict, path: Path) -> None:
    """Every varied field exists in the experiment's config: one setting built from the first value of each axis
    (and each search dimension's first value) names the field that does not."""
    first = {k: v[0] for k, v in {**sweep["grid"], **sweep["zip"]}.items() if v}
    if sweep["search"]:
        first |= search_lib.first_point(sweep["search"]["space"])
    try:
        config = config_lib.load_config(config_lib.REPO / sweep["experiment"])
        for key, value in {**sweep["fixed"], **first}.items():
            config_lib.apply_override(config, f"--config.{key}={value}")
    except config_lib.ConfigError as e:
        raise config_lib.ConfigError(f"{path}: {e}") from None


def settings_of(sweep: dict, sampled: list[dict] | None = None) -> list[dict]:
    """Every setting but the seed, in grid order: grid x zip x the search's samples (`sampled`, or for a random
    search its seeded samples)."""
    grid = [dict(zip(sweep["grid"], values)) for values in itertools.product(*sweep["grid"].values())]
    zipped = [dict(zip(sweep["zip"], values)) for values in zip(*sweep["zip"].values())] or [{}]
    if sampled is None:
        search = sweep["search"]
        sampled = search_lib.random_points(search) if search and search["kind"] == "random" else [{}]
    return [{**point, **together, **sample} for point, together, sample in itertools.product(grid, zipped, sampled)]


def expand(sweep: dict, overrides: list[str], workdir: Path, sampled: list[dict] | None = None) -> list[SweepRun]:
    """Every run of the sweep (settings_of, seeds innermost), each with its validated config or its error."""
    clash = [f for f in overrides if f.removeprefix("--config.").partition("=")[0] in _axes(sweep)]
    if clash:
        raise config_lib.ConfigError(f"{' '.join(clash)}: the sweep varies this field; edit the sweep file instead")
    points = itertools.product(settings_of(sweep, sampled), sweep["seeds"])
    return deduplicate([make_run(sweep, overrides, workdir, {**point, "train.seed": seed}) for point, seed in points])


def deduplicate(runs: list[SweepRun], known: dict[str, SweepRun] | None = None) -> list[SweepRun]:
    """The runs of `runs` new to `known` (name -> run, default empty; updated): a setting seen before counts one more
    draw of the run that has it and is dropped; a different setting under a name taken is named apart (_named_apart)."""
    known = {} if known is None else known
    new = []
    for run in runs:
        while (first := known.get(run.name)) is not None and first.settings != run.settings:
            run = _named_apart(run)
        if first is not None:
            first.draws += run.draws
            print(f"note: the sweep's search drew {run.name} again; it trains once (draws: {first.draws})")
            continue
        known[run.name] = run
        new.append(run)
    return new


def _named_apart(run: SweepRun) -> SweepRun:
    """The run under its name plus a digest of its settings' exact values (fmt shows 6 digits)."""
    digest = hashlib.sha1(json.dumps(run.settings, sort_keys=True).encode() + run.name.encode()).hexdigest()[:8]
    name = f"{run.name}_{digest}"
    return SweepRun(name, run.settings, run.workdir.parent / name, run.config, run.error, run.result, run.draws)


def make_run(sweep: dict, overrides: list[str], workdir: Path, settings: dict, name: str | None = None) -> SweepRun:
    """The run of one setting (seed included): its name (given: one deduplicate chose), folder and config, or the
    error its config has."""
    name = name or "_".join(f"{short(k)}-{fmt(v)}" for k, v in settings.items()).replace("/", "-")
    run = SweepRun(name, settings, workdir / name)
    try:
        run.config = _config(sweep, overrides, settings)
    except config_lib.ConfigError as e:
        run.error = str(e)
    return run


def _axes(sweep: dict) -> list[str]:
    return [*sweep["grid"], *sweep["zip"], *((sweep["search"] or {}).get("space", {})), "train.seed"]


def _config(sweep: dict, overrides: list[str], settings: dict) -> ml_collections.ConfigDict:
    config = config_lib.load_config(config_lib.REPO / sweep["experiment"])
    flags = [f"--config.{k}={v}" for k, v in sweep["fixed"].items()] + overrides
    flags += [f"--config.{k}={v}" for k, v in settings.items()]
    for flag in flags:
        config_lib.apply_override(config, flag)
    config_lib.validate(config)
    return config


def claim(workdir: Path, sweep: dict, overrides: list[str]) -> None:
    """Writes DIR/sweep.json, or checks that DIR holds the same sweep (so finished runs mean the same thing)."""
    identity = {"sweep": sweep, "overrides": overrides}
    path = workdir / SWEEP_FILE
    if path.is_file() and json.loads(path.read_text()) != json.loads(json.dumps(identity)):
        raise config_lib.ConfigError(f"{workdir} holds a different sweep (see {path}); choose another --workdir")
    workdir.mkdir(parents=True, exist_ok=True)
    with storage.writing("the sweep's spec", "free space or make it writable, or choose another --workdir"):
        storage.replace_file(path, json.dumps(identity, indent=1) + "\n")


def finish(run: SweepRun, result: dict) -> None:
    """Writes the run's result.json (it counts as finished from now on) and prints its one line."""
    advice = "free space or make it writable, then run the same command again (the run counts as unfinished)"
    with storage.writing(f"the result of run {run.name}", advice):  # whole or none: a rerun never reads a part
        run.workdir.mkdir(parents=True, exist_ok=True)
        storage.replace_file(run.workdir / RESULT_FILE, json.dumps(result, indent=1) + "\n")
    run.result = result
    where = f" at step {result['step']}" if result["status"] == "stopped" else ""
    error = f" ({result['error']})" if result.get("error") else ""
    print(f"[sweep] {run.name}: {result['status']}{where}{error}", flush=True)


def read_result(workdir: Path) -> dict:
    path = workdir / RESULT_FILE
    return json.loads(path.read_text()) if path.is_file() else {}
