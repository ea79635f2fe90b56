"""Processes and signals: `run.py prepare`'s workers and the multiprocessing resource tracker die with their parent
(SIGKILL included); SIGTERM / Ctrl-C outside training end every command with one line and 128 + the signal."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

import run
from txjax.ops import preemption

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc (Linux)")


def children(pid: int) -> set[int]:
    """The pids of `pid`'s children (every thread's), from /proc."""
    out = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out |= {int(c) for c in (task / "children").read_text().split()}
        except OSError:  # the thread ended
            pass
    return out


def alive(pid: int) -> bool:
    try:  # a zombie is dead: it only waits for its (new) parent to read its status
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def wait_for(what: str, predicate, seconds: float, proc=None):
    deadline = time.monotonic() + seconds
    while not (value := predicate()):
        if time.monotonic() > deadline or (proc is not None and proc.poll() is not None):
            pytest.fail(f"{what}: not within {seconds} s" + (f" (exit status {proc.poll()})" if proc else ""))
        time.sleep(0.05)
    return value


def start_prepare(tmp_path: Path, **popen) -> tuple[subprocess.Popen, Path]:
    """run.py prepare with two workers on ~6 MB of documents (a few seconds), once its workers write shards."""
    rng = random.Random(0)
    words = [f"w{i}" for i in range(30)]
    text = "\n\n".join(" ".join(rng.choices(words, k=60)) for _ in range(20_000))
    (tmp_path / "in.txt").write_text(text)
    out = tmp_path / "out"
    command = [sys.executable, str(REPO / "run.py"), "prepare", f"--input={tmp_path / 'in.txt'}", f"--output={out}"]
    command += ["--delimiter=\\n\\n", "--shard_mb=0.1", "--workers=2"]
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
    shards = lambda: list(tmp_path.glob("out.partial-*/train/*.bin"))
    wait_for("the workers' first shard", shards, 60, proc)
    return proc, out


def test_prepare_workers_and_resource_tracker_die_with_a_sigkilled_parent(tmp_path):
    proc, out = start_prepare(tmp_path)
    helpers = children(proc.pid)
    assert len(helpers) == 3  # two workers and the resource tracker
    proc.kill()
    proc.communicate()
    wait_for("every helper process gone", lambda: not any(map(alive, helpers)), 5)
    (partial,) = tmp_path.glob("out.partial-*")
    written = sorted(partial.rglob("*.bin"))
    time.sleep(0.5)
    assert sorted(partial.rglob("*.bin")) == written  # nobody writes into it any more
    assert not out.exists()


def test_a_ctrl_c_prepare_says_so_in_one_line_and_leaves_nothing(tmp_path):
    """Ctrl-C reaches the terminal's whole process group: the workers too (SIGTERM, the parent alone, is below)."""
    signum = signal.SIGINT
    proc, out = start_prepare(tmp_path, start_new_session=True)
    helpers = children(proc.pid)
    os.killpg(proc.pid, signum)
    _, err = proc.communicate(timeout=30)
    last = err.replace("\r", "\n").strip().splitlines()[-1]
    assert "Traceback" not in err and "Warning" not in err, err
    assert last == f"stopped by {signum.name}; {preemption.KEPT['prepare']}"
    assert proc.returncode == 128 + signum
    wait_for("every helper process gone", lambda: not any(map(alive, helpers)), 5)
    assert list(tmp_path.iterdir()) == [tmp_path / "in.txt"]


@pytest.mark.parametrize("command", ["eval", "generate", "import", "export"])
def test_sigterm_ends_any_other_command_with_one_line(monkeypatch, capsys, command):
    def main(argv):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)  # the handler raises out of this
        raise AssertionError("SIGTERM did not stop the command")

    module = types.SimpleNamespace(main=main)
    monkeypatch.setattr(run.importlib, "import_module", lambda name: module)
    before = signal.getsignal(signal.SIGTERM)
    assert run.main([command]) == 128 + signal.SIGTERM
    assert capsys.readouterr().err.splitlines() == [
        f"stopped by SIGTERM; {preemption.KEPT.get(command, 'nothing written')}"
    ]
    assert signal.getsignal(signal.SIGTERM) is before


def test_processes_started_ignore_ctrl_c_and_sigterm_waits_for_them():
    with pytest.raises(preemption.Stopped, match="SIGTERM"), preemption.stop_on_signals():
        with preemption.starting_processes():
            child = subprocess.run([sys.executable, "-c", "import signal; print(int(signal.getsignal(signal.SIGINT)))"],
                                   capture_output=True, text=True)  # fmt: skip
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.1)  # not raised in here
            started = True
    assert started and child.stdout.strip() == str(int(signal.SIG_IGN))
