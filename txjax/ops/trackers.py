"""Where a run's records go beside metrics.jsonl (train.trackers): TensorBoard event files in WORKDIR/tb, Weights &
Biases (txjax.ops.tracker_wandb) and MLflow (txjax.ops.tracker_mlflow), each fed the records metrics.jsonl gets
(txjax.ops.metrics_log.MetricsLog.write), the same values at the same steps.

metrics.jsonl is the run's own record (a resume, the evals it owes and a sweep's report read it), so "jsonl" is
always among the trackers; the others are optional (W&B and MLflow: the track extra). A W&B or MLflow run also gets
the resolved config (RunSpec.config) and the machine and provenance (txjax.ops.provenance.machine) when it opens,
and result.json (the final metrics run.py train prints), curves.png and eval_valid.json as artifacts when it ends.

Resume. WORKDIR/trackers.json keeps each remote tracker's run id and the last step it logged per split: a resumed run
continues the same tracker run, replays from metrics.jsonl what the tracker missed (a tracker added on resume gets the
whole history) and skips what it already has, so the tracker never sees a step twice. (A step the killed run logged
after its last checkpoint is not logged again: the tracker keeps the first values, which on CPU equal the resumed
run's bit for bit, timings aside.)

Faults. A remote tracker whose call fails (its server gone, a full disk) warns once and is dropped for the rest of the
run: training goes on, metrics.jsonl loses nothing, a later resume catches the tracker up from metrics.jsonl. Waits
are bounded (tracker_mlflow: HTTP timeout and retries; tracker_wandb: init and finish timeouts).

Sweeps. The sweep's driver opens its group once (open_sweep: W&B's `group`, an MLflow parent run with the sweep's
spec as parameters, both kept in DIR/trackers.json) and each trial's runs join it (in_sweep), in process or in a Ray
worker; every run also carries its own sweep settings.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import secrets
import sys
from pathlib import Path

from txjax.extras import require

TRACKERS = ("jsonl", "tensorboard", "wandb", "mlflow")  # jsonl first: every run has it (config.validate_trackers)
REMOTE = {"wandb": ("txjax.ops.tracker_wandb", "WandB"), "mlflow": ("txjax.ops.tracker_mlflow", "MLflow")}
STATE_FILE = "trackers.json"
ARTIFACTS = ("curves.png", "eval_valid.json")  # in the workdir, when there; result.json is written from the result


def _summary_writer_class():
    """tensorboardX.SummaryWriter, imported without PyTorch: tensorboardX tries `import torch` on import only to
    accept torch tensors, which txjax never passes, and where torch is installed (the interop extras) that import
    alone costs every run's start-up about 2 s. A None entry in sys.modules makes that import fail as if torch were
    absent, for this one import; torch stays importable afterwards."""
    hide = "torch" not in sys.modules
    if hide:
        sys.modules["torch"] = None
    try:
        from tensorboardX import SummaryWriter
    finally:
        if hide:
            del sys.modules["torch"]
    return SummaryWriter


def check_installed(names) -> None:
    """Each remote tracker's package is installed (MissingExtra: one line naming the track extra), before training."""
    for name in names:
        if name in REMOTE:
            require(name, f"train.trackers={name}")


def read_state(directory: Path) -> dict:
    path = Path(directory) / STATE_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def write_state(directory: Path, state: dict) -> None:
    """trackers.json, replaced whole (a kill leaves the old or the new file, never half of one)."""
    path = Path(directory) / STATE_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1) + "\n")
    tmp.replace(path)


def warn(name: str, what: str, error: Exception) -> None:
    print(
        f"warning: the {name} tracker failed {what} ({type(error).__name__}: {error}); training goes on without it "
        "(metrics.jsonl keeps every record; a resume catches the tracker up)",
        file=sys.stderr,
        flush=True,
    )


class Remote:
    """A W&B or MLflow run of one workdir, its calls guarded: each record logged once per (split, step), the last
    logged step per split kept in trackers.json; the first failure warns and drops the tracker."""

    def __init__(self, name: str, workdir: Path, config: str, member: dict | None):
        self.name, self.workdir = name, workdir
        state = read_state(workdir).get(name, {})
        self.logged: dict[str, int] = state.get("logged", {})
        module, cls = REMOTE[name]
        self.run = None
        try:
            self.run = getattr(importlib.import_module(module), cls)(workdir, json.loads(config), member, state)
            self.save()
        except Exception as e:  # noqa: BLE001 -- a tracker is never a reason to stop training
            warn(name, "to open its run", e)

    def save(self) -> None:
        states = read_state(self.workdir)
        states[self.name] = {**self.run.state(), "logged": self.logged}
        write_state(self.workdir, states)

    def _call(self, what: str, fn, *args) -> bool:
        if self.run is None:
            return False
        try:
            fn(*args)
            return True
        except Exception as e:  # noqa: BLE001
            warn(self.name, what, e)
            self.run = None
            return False

    def log(self, step: int, split: str, record: dict) -> None:
        if step <= self.logged.get(split, -1) or self.run is None:
            return
        if self._call(f"at step {step}", self.run.log, step, split, record):
            self.logged[split] = step
            self.save()

    def changed(self, step: int, changes: dict) -> None:
        if self.run is None or step <= self.logged.get("config", -1):
            return
        if self._call("to record a resume", self.run.changed, step, changes):
            self.logged["config"] = step
            self.save()

    def close(self, status: str, artifacts: list[Path], result: dict | None) -> None:
        if self.run is not None:
            self._call("to end its run", self.run.end, status, artifacts, result)


class Trackers:
    """The trackers of one run beside metrics.jsonl: TensorBoard (as today) and the remote ones (Remote)."""

    def __init__(self, workdir: Path, names, config: str):
        self.workdir = Path(workdir)
        self.tb = _summary_writer_class()(str(self.workdir / "tb")) if "tensorboard" in names else None
        member = _members.get(self.workdir.resolve())
        self.remote = [Remote(name, self.workdir, config, member) for name in names if name in REMOTE]

    def catch_up(self, records: list[dict]) -> None:
        """What the remote trackers missed of metrics.jsonl's history (those that have it skip it)."""
        for r in records:
            if r["split"] == "config":
                self.changed(r["step"], r["changes"])
            else:
                for tracker in self.remote:
                    tracker.log(r["step"], r["split"], {k: v for k, v in r.items() if k not in ("step", "split")})

    def log(self, step: int, split: str, record: dict) -> None:
        if self.tb is not None:
            for name, value in record.items():
                self.tb.add_scalar(f"{split}/{name}", value, step)
        for tracker in self.remote:
            tracker.log(step, split, record)

    def changed(self, step: int, changes: dict) -> None:
        """A resume's changed settings (TensorBoard has no place for them)."""
        for tracker in self.remote:
            tracker.changed(step, changes)

    def close(self, status: str, result: dict | None = None) -> None:
        """Ends the runs: status finished | failed | stopped; the artifacts (result.json from `result`) logged."""
        if self.tb is not None:
            self.tb.close()
        artifacts = [self.workdir / name for name in ARTIFACTS if (self.workdir / name).is_file()]
        for tracker in self.remote:
            tracker.close(status, artifacts, result)


_members: dict[Path, dict] = {}  # a sweep run's workdir -> {"group", "mlflow_parent", "settings"}: in_sweep


@contextlib.contextmanager
def in_sweep(settings: dict[Path, dict]):
    """While inside, the runs of these workdirs (DIR/<run>, {workdir: its sweep settings}) open their tracker runs in
    the group of their sweep DIR (open_sweep's DIR/trackers.json) with their settings: how a sweep's trial, in this
    process or a Ray worker, groups its runs."""
    added = []
    for workdir, point in settings.items():
        key = Path(workdir).resolve()
        sweep = read_state(key.parent).get("sweep", {})
        _members[key] = {**sweep, "settings": point}
        added.append(key)
    try:
        yield
    finally:
        for key in added:
            _members.pop(key, None)


def open_sweep(directory: Path, names, spec: dict) -> None:
    """The sweep's group, kept in DIR/trackers.json (a rerun of the sweep reuses it): a W&B group name and, with
    mlflow among `names`, an MLflow parent run with the sweep file's `spec` as its parameters."""
    names = [n for n in names if n in REMOTE]
    if not names:
        return
    state = read_state(directory)
    sweep = state.get("sweep") or {"group": f"{Path(directory).resolve().name}-{secrets.token_hex(3)}"}
    if "mlflow" in names:
        from txjax.ops import tracker_mlflow

        try:
            sweep["mlflow_parent"] = tracker_mlflow.open_parent(directory, sweep, spec)
        except Exception as e:  # noqa: BLE001
            warn("mlflow", "to open the sweep's parent run", e)
    write_state(directory, {**state, "sweep": sweep})


def close_sweep(directory: Path, status: str, artifacts: list[Path]) -> None:
    """Ends the sweep's MLflow parent run (if any) with the report's files as its artifacts."""
    parent = read_state(directory).get("sweep", {}).get("mlflow_parent")
    if parent:
        from txjax.ops import tracker_mlflow

        try:
            tracker_mlflow.close_parent(parent, status, [p for p in artifacts if p.is_file()])
        except Exception as e:  # noqa: BLE001
            warn("mlflow", "to end the sweep's parent run", e)
