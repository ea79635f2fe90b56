"""Tests of train.trackers against the real trackers, offline: W&B in offline mode (its run folders read back with
wandb's own record format, wandb.proto's Record, from the LevelDB-log framing of the .wandb file) and MLflow against
a tracking server this module starts (queried with MlflowClient). What each tracker logged equals metrics.jsonl step
for step; a resume continues the same tracker run and logs no step twice; a sweep's stacked runs log one run each,
grouped (W&B) and nested under one parent (MLflow); a server killed mid-run leaves training going and metrics.jsonl
whole. Tiny runs (d_model 32, one layer, a few steps); the mlflow server starts once, while the first tests train."""

import contextlib
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from txjax import config as config_lib
from txjax.extras import MissingExtra
from txjax.ops import metrics_log, preemption, trackers
from txjax.ops.metrics_log import read_metrics
from txjax.sweep.local import run_sweep
from txjax.sweep.spec import load_sweep
from txjax.training.loop import train

TINY = {
    "data.max_digits": 4,
    "data.eval_size": 20,
    "model.num_layers": 1,
    "model.num_heads": 2,
    "model.d_model": 32,
    "model.d_ff": 64,
    "train.steps": 6,
    "train.batch_size": 8,
    "train.warmup_steps": 2,
    "train.log_every": 2,
    "train.eval_every": 4,
    "train.eval_batches": 1,
    "train.checkpoint_every": 2,
}
BOTH = "jsonl,tensorboard,wandb,mlflow"


def tiny_config(**changes):
    flags = [f"--config.{k}={v}" for k, v in {**TINY, **changes}.items()]
    return config_lib.from_command_line(None, flags)


def series(records, split, key="loss"):
    return [(r["step"], r[key]) for r in records if r["split"] == split]


# W&B's offline run folders ----------------------------------------------------------------------------------------


def wandb_records(path: Path):
    """The records of a .wandb file: a 7-byte header (":W&B", magic, version), then LevelDB's log format (32 KiB
    blocks of chunks, each with a 7-byte header: crc32c, length, type FULL 1 / FIRST 2 / MIDDLE 3 / LAST 4), each
    record a wandb.proto Record. (wandb 0.31 reads these in its Go core; its Python package keeps the Record type.)"""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, pieces = 7, b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if left < 7 or (kind == 0 and length == 0):  # a block's zero-filled tail
            pos += left
            continue
        pieces += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pieces)
            pieces = b""
            yield record


def wandb_runs(workdir: Path) -> list[dict]:
    """Per offline run folder of the workdir, in the order written: its run id, group, config, history rows
    ({"_step", "train/loss", ...}) and the names of its artifact's files."""
    out = []
    for folder in sorted((workdir / "wandb").glob("offline-run-*")):
        (file,) = folder.glob("run-*.wandb")
        run = {"config": {}, "history": [], "artifacts": []}
        for record in wandb_records(file):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run |= {"id": record.run.run_id, "group": record.run.run_group}
                run["config"] |= {u.key: json.loads(u.value_json) for u in record.run.config.update}
            elif kind == "config":
                run["config"] |= {u.key: json.loads(u.value_json) for u in record.config.update}
            elif kind == "history":
                run["history"].append(
                    {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
                )
            elif kind == "artifact":
                run["artifacts"] += [e.path for e in record.artifact.manifest.contents]
        out.append(run)
    return out


def wandb_series(runs: list[dict], key: str) -> list[tuple[int, float]]:
    return [(row["_step"], row[key]) for run in runs for row in run["history"] if key in row]


# MLflow: one tracking server for the module -----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server_process(tmp_path_factory):
    """`mlflow server` on a sqlite store, started (not yet waited for) when the module's first test starts."""
    pytest.importorskip("mlflow")
    folder = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    command = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{folder}/mlflow.db"]
    command += ["--default-artifact-root", str(folder / "artifacts"), "--host", "127.0.0.1", "--port", str(port)]
    log = (folder / "server.log").open("w")
    # no job runner: MLflow 3's server would also start 8 processes of its own for jobs a tracker never uses
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    process = subprocess.Popen(  # its own process group: the server and its uvicorn worker stop together
        [*command, "--workers", "1"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env
    )
    process.uri, process.log, process.began = f"http://127.0.0.1:{port}", folder / "server.log", time.monotonic()
    yield process
    stop_server(process)


def stop_server(process) -> None:
    """SIGKILL to the server's process group (a throwaway server: nothing to shut down cleanly)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)


@pytest.fixture(autouse=True)
def offline(monkeypatch, server_process):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server_process.uri)
    pytest.importorskip("wandb")


@pytest.fixture
def mlflow_client(server_process):
    """An MlflowClient of the module's server, once it answers /health (polled for at most 180 s)."""
    from mlflow import MlflowClient

    deadline = server_process.began + 180
    while True:
        try:
            urllib.request.urlopen(server_process.uri + "/health", timeout=2)
            break
        except OSError:
            if time.monotonic() > deadline or server_process.poll() is not None:
                pytest.fail(f"mlflow server did not start: {server_process.log.read_text()[-2000:]}")
            time.sleep(0.25)
    if not hasattr(server_process, "ready_s"):
        server_process.ready_s = time.monotonic() - server_process.began
        print(f"mlflow server answered {server_process.ready_s:.1f} s after its start")
    return MlflowClient()


def mlflow_series(client, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


# the tests --------------------------------------------------------------------------------------------------------


def test_trackers_field_parses_validates_and_names_the_extra(monkeypatch):
    assert tiny_config().train.trackers == ["jsonl", "tensorboard"]  # the default: what ran before
    assert tiny_config(**{"train.trackers": "jsonl,wandb"}).train.trackers == ["jsonl", "wandb"]
    assert tiny_config(**{"train.trackers": "['jsonl', 'mlflow']"}).train.trackers == ["jsonl", "mlflow"]
    with pytest.raises(
        config_lib.ConfigError, match=r"unknown 'neptune'; the known ones: jsonl \(always\), tensorboard, wandb, mlflow"
    ):
        tiny_config(**{"train.trackers": "jsonl,neptune"})
    with pytest.raises(config_lib.ConfigError, match="jsonl missing"):
        tiny_config(**{"train.trackers": "wandb"})
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if it were not installed
    with pytest.raises(MissingExtra, match=r"pip install -e '\.\[track\]'"):
        trackers.check_installed(["jsonl", "mlflow"])


def test_a_run_and_its_resumes_log_what_metrics_jsonl_holds_once_per_step(tmp_path, mlflow_client):
    """W&B and MLflow get the records of metrics.jsonl at their steps, the config, the machine and the artifacts. A
    run stopped by a signal after step 4 (saved) and resumed from step 2 (as if killed after logging steps 3 and 4,
    before saving 4) is one tracker run: the resume adds steps 5 and 6 and logs neither 3 nor 4 again."""
    workdir, config = tmp_path / "run", tiny_config(**{"train.trackers": BOTH, "train.log_every": 1})
    stop_after_3 = lambda workdir, step, split, record: step == 3 and preemption.request("a test's request")
    with metrics_log.observe(stop_after_3), pytest.raises(preemption.Preempted):
        train(config, workdir)
    state = json.loads((workdir / trackers.STATE_FILE).read_text())
    assert state["mlflow"]["logged"] == {"train": 4}
    assert mlflow_client.get_run(state["mlflow"]["run_id"]).info.status == "KILLED"
    shutil.rmtree(workdir / "checkpoints" / "4")
    assert train(config, workdir)["step"] == 6
    records = read_metrics(workdir)
    assert [s for s, _ in series(records, "train")] == [1, 2, 3, 4, 5, 6]
    assert json.loads((workdir / trackers.STATE_FILE).read_text())["mlflow"]["run_id"] == state["mlflow"]["run_id"]

    runs = wandb_runs(workdir)  # the run and its resume: two folders of one W&B run
    assert len(runs) == 2 and {r["id"] for r in runs} == {state["wandb"]["id"]}
    for split in ("train", "valid"):
        assert wandb_series(runs, f"{split}/loss") == series(records, split)  # each step once, equal values
    assert runs[0]["config"]["model"]["d_model"] == 32 and runs[0]["config"]["train"]["trackers"] == BOTH.split(",")
    assert runs[0]["config"]["provenance"]["cpu_model"]
    assert {"result.json", "curves.png", "eval_valid.json"} <= set(runs[1]["artifacts"])
    resumed = [(row["_step"], "train/loss" in row, "valid/loss" in row) for row in runs[1]["history"]]
    assert resumed == [(4, False, True), (5, True, False), (6, True, True)]  # what the stopped run had not logged

    run_id = state["mlflow"]["run_id"]
    for split in ("train", "valid"):
        assert mlflow_series(mlflow_client, run_id, f"{split}/loss") == series(records, split)
    lr = mlflow_series(mlflow_client, run_id, "train/learning_rate")
    np.testing.assert_array_equal([v for _, v in lr], [v for _, v in series(records, "train", "learning_rate")])
    run = mlflow_client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.params["model.d_model"] == "32"
    assert run.data.tags["machine.cpu_model"]
    assert {"config.json", "result.json", "curves.png", "eval_valid.json"} <= {
        a.path for a in mlflow_client.list_artifacts(run_id)
    }
    result = json.loads(Path(mlflow_client.download_artifacts(run_id, "result.json", str(tmp_path))).read_text())
    assert result["step"] == 6 and result["valid_loss"] == series(records, "valid")[-1][1]


def test_a_sweeps_stacked_runs_are_grouped_and_nested_under_one_parent(tmp_path, mlflow_client):
    """Two seeds trained stacked (one vmapped program) log one tracker run each, in the sweep's W&B group and under
    its MLflow parent run, which holds the sweep's spec as parameters and its report as artifacts."""
    path = tmp_path / "sweep.py"
    fixed = {**TINY, "train.steps": 4, "train.trackers": BOTH}
    spec = {"experiment": "experiments/reverse.py", "fixed": fixed, "seeds": [0, 1]}
    path.write_text(f"def get_sweep():\n    return {spec!r}\n")
    workdir = tmp_path / "sweep"
    runs = run_sweep(load_sweep(path), workdir, [])
    assert [r.result["runs_vmapped"] for r in runs] == [2, 2]
    group = json.loads((workdir / trackers.STATE_FILE).read_text())["sweep"]
    parent = mlflow_client.get_run(group["mlflow_parent"])
    assert parent.info.status == "FINISHED" and parent.data.params["seeds"] == "[0, 1]"
    assert {"results.csv", "results.md"} <= {a.path for a in mlflow_client.list_artifacts(parent.info.run_id)}
    ids = set()
    for run in runs:
        records, state = read_metrics(run.workdir), json.loads((run.workdir / trackers.STATE_FILE).read_text())
        child = mlflow_client.get_run(state["mlflow"]["run_id"])
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert json.loads(child.data.tags["txjax.sweep_settings"]) == run.settings
        assert mlflow_series(mlflow_client, child.info.run_id, "train/loss") == series(records, "train")
        (w,) = wandb_runs(run.workdir)
        assert w["group"] == group["group"] and w["config"]["sweep"] == run.settings
        assert wandb_series([w], "train/loss") == series(records, "train")
        ids |= {child.info.run_id, w["id"]}
    assert len(ids) == 4


def test_a_rerun_of_a_run_finished_while_mlflow_was_down_logs_the_runs_own_result(
    tmp_path, mlflow_client, server_process, monkeypatch, capfd
):
    """No server answers for the whole run (a port nobody listens on): one warning, the run finishes. Its rerun with
    the server back catches the series up and logs as result.json what the run printed, its train loss, step times
    and compile counts, not those of the rerun, which trained no step."""
    workdir, config = tmp_path / "run", tiny_config(**{"train.trackers": "jsonl,mlflow", "train.steps": 4})
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # refused at once
    result = train(config, workdir)
    assert capfd.readouterr().err.count("the mlflow tracker failed") == 1
    assert result["train_step_compiles"] == 1 and result["ms_per_step_median"] > 0
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server_process.uri)
    assert train(config, workdir) == result
    run_id = json.loads((workdir / trackers.STATE_FILE).read_text())["mlflow"]["run_id"]
    records = read_metrics(workdir)
    assert mlflow_series(mlflow_client, run_id, "train/loss") == series(records, "train")
    assert result["train_loss"] == series(records, "train")[-1][1]
    logged = json.loads(Path(mlflow_client.download_artifacts(run_id, "result.json", str(tmp_path))).read_text())
    assert logged == result


def test_a_killed_server_leaves_training_running_and_metrics_jsonl_whole(
    tmp_path, mlflow_client, server_process, capfd
):
    """The module's server is killed after the run's first record (so this test runs last): the tracker warns once
    and training goes on to its end, metrics.jsonl holding every record; the bounded retries cost seconds."""
    killed = []

    def kill_server(workdir, step, split, record):
        if not killed:
            stop_server(server_process)
            killed.append(time.monotonic())

    workdir = tmp_path / "run"
    with metrics_log.observe(kill_server):
        result = train(tiny_config(**{"train.trackers": "jsonl,mlflow", "train.steps": 4}), workdir)
    seconds_after_kill = time.monotonic() - killed[0]
    assert result["step"] == 4
    records = read_metrics(workdir)
    assert [s for s, _ in series(records, "train")] == [2, 4] and [s for s, _ in series(records, "valid")] == [4]
    warnings = capfd.readouterr().err.count("the mlflow tracker failed")
    assert warnings == 1, warnings
    state = json.loads((workdir / trackers.STATE_FILE).read_text())["mlflow"]
    assert state["logged"] == {"train": 2}  # the first record (logged before the observer killed it) alone
    print(f"training went on {seconds_after_kill:.1f} s after the kill")
