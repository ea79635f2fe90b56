"""Processes and signals: `run.py prepare`'s workers and the multiprocessing resource tracker die with their parent
(SIGKILL included); SIGTERM / Ctrl-C outside training end every command with one line and 128 + the signal."""

from __future__ import annotations

import gc
import os
import random
import signal
import subprocess
import sys
import time
import types
import weakref
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
    monkeypatch.setattr(run, "importlib", types.SimpleNamespace(import_module=lambda name: module))
    before = signal.getsignal(signal.SIGTERM)
    assert run.main([command]) == 128 + signal.SIGTERM
    assert capsys.readouterr().err.splitlines() == [
        f"stopped by SIGTERM; {preemption.KEPT.get(command, 'nothing written')}"
    ]
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize("command", ["import", "export", "prepare"])
def test_a_signal_after_the_work_is_complete_ends_with_0_and_says_so(monkeypatch, capsys, command):
    """A job script's SIGTERM once the output is in place (the command called preemption.complete) ends the command
    with its summary and status 0, not 143: a retried import would fail on the workdir the first one wrote."""

    def main(argv):
        preemption.complete()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)  # the handler runs in here, and returns
        print('{"workdir": "w"}')

    monkeypatch.setattr(
        run, "importlib", types.SimpleNamespace(import_module=lambda name: types.SimpleNamespace(main=main))
    )
    assert run.main([command]) == 0
    out, err = capsys.readouterr()
    assert out == '{"workdir": "w"}\n'
    assert err.splitlines() == [f"SIGTERM arrived after run.py {command} completed its work; nothing was lost (exit 0)"]


TEARDOWN = """
import atexit, importlib, signal, sys, time, types
import run

def teardown():  # as JAX's and orbax's exit handlers: a while, here until the signal's handler ran (it gives
    print("tearing down", flush=True)  # the signals their default action back), at most 60 s
    deadline = time.monotonic() + 60
    while signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL and time.monotonic() < deadline:
        time.sleep(0.01)

def main(argv):
    atexit.register(teardown)
    print('{"workdir": "w"}')

real = importlib.import_module
importlib.import_module = lambda name, package=None: (
    types.SimpleNamespace(main=main) if name == run.COMMANDS["import"] else real(name, package)
)
sys.exit(run.main(["import"], exiting=True))
"""


def test_a_signal_during_the_teardown_after_status_0_keeps_it():
    """The summary printed and main returned 0: a SIGTERM while the interpreter's exit handlers run ends the process
    with 0 and one line (it was killed, 143, without a word)."""
    proc = subprocess.Popen([sys.executable, "-c", TEARDOWN], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    assert proc.stdout.readline() == '{"workdir": "w"}\n'
    assert proc.stdout.readline() == "tearing down\n"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert (proc.returncode, err) == (0, preemption.after_work_line(signal.SIGTERM, "import") + "\n")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("inside", ["gc_callback", "finalizer", "weakref_callback"])
def test_a_signal_inside_a_gc_callback_or_finalizer_still_stops_the_command(monkeypatch, capsys, signum, inside):
    """Ctrl-C during lm-eval was lost when it arrived in JAX's _xla_gc_callback (Python prints and drops an
    exception raised there): a Stopped that Python drops is sent again, so the command stops with its line, here in
    the sleep after the callback. weakref_callback: any library's callback (CI on Python 3.13 saw the signal land in
    WeakSet's, during a gc.collect(), which a list of known callback frames did not name)."""
    sent = []

    def send():
        if not sent:
            sent.append(signum)
            os.kill(os.getpid(), signum)
            for _ in range(1000):  # the handler runs between these bytecodes, inside the callback
                pass

    class Finalized:
        def __del__(self):
            send()

    class Referent:
        pass

    def main(argv):
        if inside == "finalizer":
            Finalized()
        elif inside == "weakref_callback":
            referent = Referent()
            ref = weakref.ref(referent, lambda _: send())
            del referent  # the callback runs here, in a frame of this file
            assert ref() is None
        else:
            gc.callbacks.append(lambda phase, info: send())
            try:
                gc.collect()
            finally:
                gc.callbacks.pop()
        time.sleep(60)  # the signal comes again and is raised out of this
        raise AssertionError("the signal did not stop the command")

    monkeypatch.setattr(
        run, "importlib", types.SimpleNamespace(import_module=lambda name: types.SimpleNamespace(main=main))
    )
    began = time.monotonic()
    assert run.main(["lm-eval"]) == 128 + signum and sent == [signum]
    name = signal.Signals(signum).name
    assert capsys.readouterr().err.splitlines() == [f"stopped by {name}; nothing written"]
    assert time.monotonic() - began < 30  # stopped inside the sleep, not after it (a loaded machine's gc: seconds)


@pytest.fixture(scope="module")
def tiny_workdir(tmp_path_factory):
    from test_train import tiny_config

    from txjax.training.loop import train

    workdir = tmp_path_factory.mktemp("tiny") / "run"
    train(tiny_config("--config.train.eval_every=0"), workdir)
    return workdir


@pytest.mark.parametrize(
    "command, signum, when",
    [
        (["generate", "--prompt=12", "--max_new_tokens=1000000"], signal.SIGINT, "after its first output"),
        (["eval"], signal.SIGTERM, "while it imports"),
    ],
)
def test_a_signal_to_a_run_py_subprocess_ends_it_with_one_line(tiny_workdir, command, signum, when):
    """A real run.py: a signal while its modules import (recorded, acted on after) or while it works."""
    argv = [sys.executable, str(REPO / "run.py"), command[0], f"--workdir={tiny_workdir}", *command[1:]]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if when == "after its first output":
        os.set_blocking(proc.stdout.fileno(), False)
        wait_for("the first generated text", lambda: proc.stdout.read(1), 120, proc)
    else:
        time.sleep(0.5)  # run.py's imports take seconds
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert (
        err.strip().splitlines()[-1]
        == f"stopped by {signum.name}; {preemption.KEPT.get(command[0], 'nothing written')}"
    )
    assert proc.returncode == 128 + signum


def test_processes_started_ignore_ctrl_c_and_sigterm_waits_for_them():
    with pytest.raises(preemption.Stopped, match="SIGTERM"), preemption.stop_on_signals():
        with preemption.starting_processes():
            child = subprocess.run([sys.executable, "-c", "import signal; print(int(signal.getsignal(signal.SIGINT)))"],
                                   capture_output=True, text=True)  # fmt: skip
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.1)  # not raised in here
            started = True
    assert started and child.stdout.strip() == str(int(signal.SIG_IGN))
