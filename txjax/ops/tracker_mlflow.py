"""MLflow as a tracker (train.trackers=jsonl,...,mlflow; the track extra): one MLflow run per txjax run, its id kept
in WORKDIR/trackers.json so that a resumed run continues it (txjax.ops.trackers); a sweep's runs nested under one
parent run (open_parent) that holds the sweep file's spec as parameters and, at the end, its report.

The environment chooses where it goes: MLFLOW_TRACKING_URI (a server, http://HOST:PORT, or a local store, e.g.
sqlite:///mlflow.db; MLflow's default otherwise) and MLFLOW_EXPERIMENT_NAME (default "txjax"). The resolved config
is logged as parameters ("model.d_model", ...) and as the artifact config.json, the machine as tags "machine.*",
the metrics as "split/metric" (train/loss, valid/loss) at their step, one log_batch request per record.

Bounded waits: by default MLflow's HTTP client waits up to 120 s for each answer and retries a failed request 7 times
with exponential backoff, minutes of a stalled training loop when the server is gone. Unless the environment sets
them, HTTP_WAITS bound one request to about 10 s and its retries to 2 (a server that refuses connections fails in
about 3 s, one that hangs in about 30 s), after which the tracker warns and is dropped for the rest of the run.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from txjax.extras import require
from txjax.ops.provenance import machine

HTTP_WAITS = {
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",  # seconds per request
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",  # waits about 1 s, 2 s between the tries (an integer)
}
STATUS = {"finished": "FINISHED", "failed": "FAILED", "stopped": "KILLED"}
BATCH = 100  # parameters per log_batch request (MLflow's limit)


def client():
    """An MlflowClient of MLFLOW_TRACKING_URI, its HTTP waits bounded (HTTP_WAITS, unless set)."""
    require("mlflow", "train.trackers=mlflow")
    for name, value in HTTP_WAITS.items():
        os.environ.setdefault(name, value)
    from mlflow import MlflowClient

    return MlflowClient()


def experiment_id(c) -> str:
    name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "txjax")
    found = c.get_experiment_by_name(name)
    return found.experiment_id if found else c.create_experiment(name)


def flat(tree: dict, prefix: str = "") -> dict[str, str]:
    """{"section.field": value as text} of a nested dict (lists and None as JSON)."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out |= flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value if isinstance(value, str) else json.dumps(value)
    return out


def log_params(c, run_id: str, params: dict[str, str]) -> None:
    from mlflow.entities import Param

    items = [Param(k, v) for k, v in params.items()]
    for i in range(0, len(items), BATCH):
        c.log_batch(run_id, params=items[i : i + BATCH])


def set_tags(c, run_id: str, tags: dict) -> None:
    from mlflow.entities import RunTag

    c.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])


class MLflow:
    """An MLflow run: parameters and config.json when created, machine tags at every (re)start."""

    def __init__(self, workdir: Path, config: dict, member: dict | None, state: dict):
        self.client = c = client()
        if "run_id" in state:
            self.run_id = state["run_id"]
            c.update_run(self.run_id, status="RUNNING")
        else:
            name = Path(workdir).resolve().name
            tags = {"txjax.workdir": str(Path(workdir).resolve())}
            if member:
                tags["txjax.sweep"] = member.get("group", "")
                tags["txjax.sweep_settings"] = json.dumps(member["settings"])
                if member.get("mlflow_parent"):
                    tags["mlflow.parentRunId"] = member["mlflow_parent"]
            self.run_id = c.create_run(experiment_id(c), run_name=name, tags=tags).info.run_id
            log_params(c, self.run_id, flat(config))
            c.log_text(self.run_id, json.dumps(config, indent=1) + "\n", "config.json")
        set_tags(c, self.run_id, {f"machine.{k}": v for k, v in flat(machine(" ".join(sys.argv))).items()})

    def state(self) -> dict:
        return {"run_id": self.run_id}

    def log(self, step: int, split: str, record: dict) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(f"{split}/{k}", float(v), now, step) for k, v in record.items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def changed(self, step: int, changes: dict) -> None:
        set_tags(self.client, self.run_id, {f"txjax.resumed_at_step_{step}": json.dumps(changes)})

    def end(self, status: str, artifacts: list[Path], result: dict | None) -> None:
        if result is not None:
            self.client.log_dict(self.run_id, result, "result.json")
        for path in artifacts:
            self.client.log_artifact(self.run_id, str(path))
        self.client.set_terminated(self.run_id, STATUS[status])


def open_parent(directory: Path, sweep: dict, spec: dict) -> str:
    """The sweep's parent run (created, or the one a previous command of the sweep created, restarted): the sweep
    file's spec as parameters ("grid.train.learning_rate": "[0.001, 0.003]", ...)."""
    c = client()
    if sweep.get("mlflow_parent"):
        c.update_run(sweep["mlflow_parent"], status="RUNNING")
        return sweep["mlflow_parent"]
    tags = {"txjax.sweep": sweep["group"], "txjax.workdir": str(Path(directory).resolve())}
    run_id = c.create_run(experiment_id(c), run_name=sweep["group"], tags=tags).info.run_id
    log_params(c, run_id, flat(spec))
    return run_id


def close_parent(run_id: str, status: str, artifacts: list[Path]) -> None:
    c = client()
    for path in artifacts:
        c.log_artifact(run_id, str(path))
    c.set_terminated(run_id, STATUS[status])
