"""One writer per workdir: an OS file lock held by `run.py train` and `run.py sweep` while they write.

    with hold(workdir): ...       # ConfigError at once, naming the holder, when another run writes there
flock(2) on DIR/writer.lock: the kernel releases the lock when its holder exits, however it exits (SIGKILL
included), so a lock is never stale and there is nothing to clean up by hand. The file holds the holder's pid, host,
start time and command, for the error message only: the lock, not the file, is the truth. Readers (eval, generate,
attention, inspect) take no lock and work while a run trains. With jax.distributed, process 0 takes the lock and
tells the others (flock works across hosts on NFSv4, where Linux maps it onto a byte-range lock).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import sys
import time
from pathlib import Path

import jax
import numpy as np
from jax.experimental import multihost_utils

from txjax.errors import ConfigError
from txjax.ops import storage
from txjax.ops.storage import StorageError
from txjax.parallel.distributed import is_lead

LOCK_FILE = "writer.lock"


class Busy(ConfigError):
    """Another live process holds the workdir's writer lock (a sweep leaves such a run to its holder)."""


@contextlib.contextmanager
def hold(workdir: str | Path):
    """Holds `workdir`'s writer lock while inside (creating the folder; a folder created here and left empty, as by
    a bad input, is removed again on the way out)."""
    workdir = Path(workdir)
    created = not workdir.exists()
    fd, error = None, None
    if is_lead():
        try:
            fd = _acquire(workdir)
        except ConfigError as e:
            error = e
    if jax.process_count() > 1 and not multihost_utils.broadcast_one_to_all(np.int32(error is None)):
        error = error or ConfigError(f"{workdir}: process 0 could not take the writer lock (see its error)")
    if error is not None:
        raise error
    try:
        yield
    finally:
        if fd is not None:
            with contextlib.suppress(FileNotFoundError):  # before letting go: a process that opened it sees it gone
                os.unlink(workdir / LOCK_FILE)
            os.close(fd)
            if created and workdir.is_dir() and not any(workdir.iterdir()):
                workdir.rmdir()


def _acquire(workdir: Path) -> int:
    """The lock's file descriptor; a workdir that cannot be written (a file, read-only, full) is a StorageError
    here, before anything is read or compiled."""
    if workdir.exists() and not workdir.is_dir():
        raise StorageError(f"--workdir {workdir.resolve()} is a file, not a folder: choose another --workdir")
    with storage.writing(f"the workdir {workdir.resolve()}", "choose another --workdir, or free space there"):
        workdir.mkdir(parents=True, exist_ok=True)
        fd = _lock(workdir / LOCK_FILE)
        try:
            os.write(fd, (json.dumps(_holder()) + "\n").encode())
        except OSError:
            os.close(fd)
            raise
    return fd


def _lock(path: Path) -> int:
    workdir = path.parent
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 4096).decode(errors="replace")
            os.close(fd)
            raise Busy(
                f"{workdir.resolve()} is being written by another run ({_describe(holder)}); wait for it to end or "
                "stop it, or choose another --workdir"
            ) from None
        with contextlib.suppress(FileNotFoundError):
            if os.stat(path).st_ino == os.fstat(fd).st_ino:  # else the holder unlinked it on its way out: retry
                break
        os.close(fd)
    return fd


def _holder() -> dict:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(sys.argv),
    }


def _describe(text: str) -> str:
    try:
        h = json.loads(text)
        return f"pid {h['pid']} on host {h['host']}, since {h['started']}: {h['command']}"
    except (ValueError, KeyError, TypeError):
        return "a process that has not yet written its pid"


def clear(workdir: Path) -> None:
    """Removes what a refused run wrote into the workdir it created (all but the held lock, which hold's exit
    removes with the then empty folder)."""
    for entry in workdir.iterdir():
        if entry.name != LOCK_FILE:
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
