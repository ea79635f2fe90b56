"""Storage faults are one `error:` line (txjax.ops.storage): a checkpoint save that fails stops the run at that step,
naming the folder and the last good checkpoint; a workdir that is a file, read-only or full is refused before
anything compiles; `run.py eval` prints its result when it cannot write it. A full or read-only disk is a small
tmpfs where this process may mount one (root on a plain machine), else a patched writer raising the same OSError."""

import asyncio
import contextlib
import csv
import errno
import gc
import json
import subprocess
import sys

import pytest
from test_sweep import sweep_file
from test_train import TINY_FLAGS

import run
import txjax.cli.eval
import txjax.data.prepare
import txjax.ops.storage
import txjax.sweep.local
from txjax.ops.metrics_log import read_metrics
from txjax.state.checkpoint import Checkpointer


@contextlib.contextmanager
def mounted(path, options: str):
    """A tmpfs at `path` (yields True), or nothing mounted (yields False) where mounting is not allowed."""
    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True)
    try:
        yield done.returncode == 0
    finally:
        if done.returncode == 0:
            subprocess.run(["umount", "-l", str(path)], check=True)


def fill(folder, slack: int = 0) -> None:
    """Fills the filesystem of `folder` but for about `slack` bytes."""
    with open(folder / "ballast", "wb", buffering=0) as f, contextlib.suppress(OSError):
        free = subprocess.run(["df", "-B1", "--output=avail", str(folder)], capture_output=True, text=True)
        f.write(b"\0" * max(0, int(free.stdout.split()[-1]) - slack))
        while True:  # what df rounded away
            f.write(b"\0" * 4096)


def one_error(capsys) -> str:
    """The run's one `error:` line (there is no other, and no traceback)."""
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err, err[-3000:]
    return errors[0]


@pytest.mark.parametrize("disk", ["tmpfs", "patched"])
def test_a_failed_save_stops_the_run_at_that_step_naming_the_last_good_checkpoint(disk, tmp_path, monkeypatch, capsys):
    """The disk fills after the checkpoint of step 2: the save of step 4 fails (in orbax's background threads) and
    the run stops there, no step after it trained, with one line; the checkpoint of step 2 is whole."""
    with mounted(tmp_path / "disk", "size=8m") as is_tmpfs:
        if disk == "tmpfs" and not is_tmpfs:
            pytest.skip("mounting a tmpfs is not allowed here")
        workdir = tmp_path / "disk" / "run"
        save = Checkpointer.save

        def save_then_fill(self, step, state):
            save(self, step, state)
            if step == 2 and disk == "tmpfs":
                fill(workdir, slack=16 * 1024)  # room for the metrics lines, not for a checkpoint

        def no_space(self):
            raise OSError(errno.ENOSPC, "No space left on device", str(self.directory / "4"))

        monkeypatch.setattr(Checkpointer, "save", save_then_fill)
        if disk == "patched":
            monkeypatch.setattr(Checkpointer, "_write_checksums", lambda self: self._saving == 4 and no_space(self))
        flags = [*TINY_FLAGS, "--config.train.steps=8", "--config.train.log_every=1"]
        assert run.main(["train", f"--workdir={workdir}", *flags]) == 2
        line = one_error(capsys)
        assert line.startswith(f"error: cannot write checkpoint step 4 in {workdir / 'checkpoints'} (")
        assert "No space left on device" in line and "training stopped at step 4" in line
        assert "the last good checkpoint is step 2" in line
        assert max(r["step"] for r in read_metrics(workdir) if r["split"] == "train") == 4
        assert Checkpointer(workdir / "checkpoints", 3).latest_step() == 2


def test_a_workdir_that_cannot_be_written_is_one_line_before_anything_compiles(tmp_path, capsys):
    (tmp_path / "file").write_text("not a folder")
    assert run.main(["train", f"--workdir={tmp_path / 'file'}", *TINY_FLAGS]) == 2
    assert (
        one_error(capsys) == f"error: --workdir {tmp_path / 'file'} is a file, not a folder: choose another --workdir"
    )
    for name, options in [("read_only", "ro,size=1m"), ("full", "size=64k")]:
        with mounted(tmp_path / name, options) as is_tmpfs:
            if not is_tmpfs:
                continue  # mounting is not allowed here: the file case above stands for them
            if name == "full":
                fill(tmp_path / name)
            assert run.main(["train", f"--workdir={tmp_path / name / 'run'}", *TINY_FLAGS]) == 2
            reason = "Read-only file system" if name == "read_only" else "No space left on device"
            line = one_error(capsys)
            assert line.startswith(f"error: cannot write the workdir {tmp_path / name / 'run'} (") and reason in line


def test_eval_prints_its_result_when_it_cannot_write_it(tmp_path, monkeypatch, capsys):
    """A read-only workdir (remounted so after training, or a patched writer): the metrics are printed, then one
    warning line."""
    with mounted(tmp_path / "disk", "size=8m") as is_tmpfs:
        workdir = tmp_path / "disk" / "run"
        assert run.main(["train", f"--workdir={workdir}", *TINY_FLAGS]) == 0
        recorded = (workdir / "eval_valid.json").read_text()
        if is_tmpfs:
            subprocess.run(["mount", "-o", "remount,ro", str(tmp_path / "disk")], check=True)
        else:

            def read_only(workdir, split, metrics):
                raise OSError(errno.EROFS, "Read-only file system", str(workdir / f"eval_{split}.json"))

            monkeypatch.setattr(txjax.cli.eval, "write_metrics", read_only)
        capsys.readouterr()
        assert run.main(["eval", f"--workdir={workdir}"]) == 0
        out, err = capsys.readouterr()
        assert '"split": "valid", "step": 6' in out.splitlines()[-1]
        assert err.strip().splitlines() == [
            f"warning: the result above is not saved ({workdir / 'eval_valid.json'}: Read-only file system)"
        ]
        assert (workdir / "eval_valid.json").read_text() == recorded


def corpus(tmp_path):
    """About 100 KB of text in 200 documents: shards of about 200 KB (uint16 ids)."""
    path = tmp_path / "corpus.txt"
    path.write_text("".join(f"document {i} " * 50 + "\n\n" for i in range(200)))
    return path


@pytest.mark.parametrize("disk", ["full", "read_only", "patched"])
def test_prepare_onto_a_full_or_read_only_disk_is_one_line_and_leaves_nothing(disk, tmp_path, monkeypatch, capsys):
    """The error names the output folder and the file; no DIR and no DIR.partial-PID is left for a rerun to trust."""
    options = {"full": "size=64k", "read_only": "ro,size=1m", "patched": "size=8m"}[disk]
    with mounted(tmp_path / "disk", options) as is_tmpfs:
        if disk != "patched" and not is_tmpfs:
            pytest.skip("mounting a tmpfs is not allowed here")
        out = tmp_path / "disk" / "prepared"
        if disk == "patched":

            def no_space(self, data):
                raise OSError(errno.ENOSPC, "No space left on device", str(self.path))

            monkeypatch.setattr(txjax.data.prepare.storage.Appending, "write", no_space)
        flags = [f"--input={corpus(tmp_path)}", f"--output={out}", "--delimiter=\\n\\n", "--workers=1"]
        assert run.main(["prepare", *flags]) == 2
        line = one_error(capsys)
        reason = "Read-only file system" if disk == "read_only" else "No space left on device"
        assert line.startswith(f"error: cannot write {out} ({out}.partial-") and reason in line
        assert list((tmp_path / "disk").iterdir()) == []


def test_export_onto_a_full_or_read_only_disk_is_one_line_and_leaves_nothing(tmp_path, capsys):
    """The Hugging Face folder's writer (safetensors' Rust I/O error on a full disk): one line naming
    the target; nothing at the target, no temporary folder beside it."""
    workdir = tmp_path / "run"
    llama = ["positional=rope", "norm=rmsnorm", "activation=swiglu", "attention_scale=sqrt", "use_bias=false"]
    flags = [*TINY_FLAGS, "--config.train.steps=1", *(f"--config.model.{flag}" for flag in llama)]
    assert run.main(["train", f"--workdir={workdir}", *flags]) == 0
    for name, options in [("full", "size=16k"), ("read_only", "ro,size=1m")]:
        with mounted(tmp_path / name, options) as is_tmpfs:
            if not is_tmpfs:
                pytest.skip("mounting a tmpfs is not allowed here")
            capsys.readouterr()
            target = tmp_path / name / "hf"
            assert run.main(["export", f"--workdir={workdir}", f"--to={target}"]) == 2
            reason = "Read-only file system" if name == "read_only" else "No space left on device"
            line = one_error(capsys)
            assert line.startswith(f"error: cannot write {target} (") and reason in line
            assert list((tmp_path / name).iterdir()) == []


@pytest.mark.parametrize("disk", ["full", "read_only", "patched"])
def test_a_sweep_onto_a_full_or_read_only_disk_is_one_line_and_leaves_nothing_half_written(
    disk, tmp_path, monkeypatch, capsys
):
    """Two runs (training patched out: no compile). After the first, the disk fills or the second run's folder is
    read-only (its result.json cannot be written), or the report's PNG cannot be written (patched): one line naming
    the file; every file left is whole (the report of the first run, result.json files that parse), no part of one,
    and a run whose result is not written is not counted as done: with the disk back, the same command trains it
    and the report is whole."""
    with mounted(tmp_path / "disk", "size=8m") as is_tmpfs:
        if disk != "patched" and not is_tmpfs:
            pytest.skip("mounting a tmpfs is not allowed here")
        sweep_file(tmp_path, grid={"model.num_heads": [2, 4]})
        workdir, trained = tmp_path / "disk" / "sweep", []
        write_file = txjax.ops.storage.write_file

        def png_fails(path, data):
            if path.endswith(".results.png.part"):
                raise OSError(errno.ENOSPC, "No space left on device", path)
            write_file(path, data)

        def train_runs(configs, workdirs):
            trained.extend(w.name for w in workdirs)
            if len(trained) == 2 and disk == "full":
                fill(tmp_path / "disk")
            elif len(trained) == 2 and disk == "read_only":  # the run's folder (the sweep's lock file stays open)
                (workdir / second).mkdir()
                subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(workdir / second)], check=True)
            elif len(trained) == 2:
                monkeypatch.setattr(txjax.ops.storage, "write_file", png_fails)
            return [None] * len(configs)  # done

        monkeypatch.setattr(txjax.sweep.local, "train_runs", train_runs)
        command = ["sweep", f"--sweep={tmp_path / 'sweep.py'}", f"--workdir={workdir}"]
        first, second = "num_heads-2_seed-0", "num_heads-4_seed-0"
        assert run.main(command) == 2
        line = one_error(capsys)
        reason = "Read-only file system" if disk == "read_only" else "No space left on device"
        if disk == "patched":
            assert line.startswith(f"error: cannot write the sweep's report ({workdir / 'results.png'}: {reason})")
        else:
            assert line.startswith(f"error: cannot write the result of run {second} ({workdir / second}")
            assert reason in line and not (workdir / second / "result.json").exists()
        assert not list(workdir.rglob("*.part"))
        assert json.loads((workdir / first / "result.json").read_text())["status"] == "done"
        status = {row["run"]: row["status"] for row in csv.DictReader((workdir / "results.csv").open())}
        assert status == {first: "done", second: "done" if disk == "patched" else "pending"}
        assert json.loads((workdir / "results.json").read_text())["per_setting"]
        assert (workdir / "results.png").read_bytes()[:4] == b"\x89PNG"

        if disk == "full":
            (tmp_path / "disk" / "ballast").unlink()
        elif disk == "read_only":
            subprocess.run(["umount", "-l", str(workdir / second)], check=True)
        monkeypatch.setattr(txjax.ops.storage, "write_file", write_file)
        assert run.main(command) == 0
        assert trained == [first, second] + ([] if disk == "patched" else [second])
        status = {row["run"]: row["status"] for row in csv.DictReader((workdir / "results.csv").open())}
        assert status == {first: "done", second: "done"} and not list(workdir.rglob("*.part"))


def test_a_failed_saves_other_writes_print_nothing_when_they_end(tmp_path, monkeypatch, capsys, caplog):
    """A full disk under `run.py import` (a save failing while its other writes are in flight) printed bare
    tracebacks beside its one line (in 4 of 12 imports onto a 96 KiB tmpfs): writes ending after orbax closed the
    save's event loop (tensorstore posts each to the closed loop: an unraisable RuntimeError) and their errors nobody
    retrieved (asyncio's log). Both, made here as they happen there, print nothing once a Checkpointer exists; other
    reports still show."""
    ts = pytest.importorskip("tensorstore")  # orbax's storage layer
    monkeypatch.setattr(sys, "unraisablehook", sys.__unraisablehook__)  # Python's own printer, not pytest's
    Checkpointer(tmp_path / "checkpoints", 1).close()
    loop = asyncio.new_event_loop()
    promise, write = ts.Promise.new()

    async def await_the_write():
        waiting = write.__await__()
        return next(waiting), waiting  # its completion is to be posted to this loop

    pending = loop.run_until_complete(await_the_write())
    loop.close()
    promise.set_result(None)  # the write ends after its loop closed
    for error in (OSError(errno.ENOSPC, "No space left on device", "x"), ValueError("not a storage error")):
        loop.create_future().set_exception(error)  # never retrieved: logged when collected
    gc.collect()

    class Finalizer:
        def __del__(self):
            raise KeyError("another unraisable")

    Finalizer()
    err = capsys.readouterr().err
    assert "Event loop is closed" not in err and "KeyError: 'another unraisable'" in err, err
    unretrieved = [r.exc_info[1] for r in caplog.records if "never retrieved" in r.getMessage()]
    assert [str(e) for e in unretrieved] == ["not a storage error"]
    del pending
