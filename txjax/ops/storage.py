"""Storage faults as one line: a full disk, a read-only filesystem, a quota, a permission, a workdir that is a file.

    writing(what, advice)   turns an OSError of those kinds raised inside into a StorageError naming the path
    write_file(path, data)  writes bytes whose OSError names the path (numpy's tofile loses the errno)
    replace_file(path, data) the same, whole or not at all: a file beside it renamed over it (reports, results)
    Appending(path)         the same for a file written piece by piece (prepare's shards)
    quiet_orbax()           holds back orbax's logged tracebacks of a failed save (the StorageError says it once)
    drop_stray_write_reports() and the reports of its other writes ending after it (asyncio's, tensorstore's)
    sha256(path)            a file's SHA-256, read in blocks (checkpoint checksums, prepare's record of its inputs)
A StorageError is a ConfigError: run.py prints it as `error: ...` and exits with status 2.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import re
import sys
import traceback

from txjax.errors import ConfigError

ERRNOS = (errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EEXIST, errno.ENOTDIR, errno.EIO)


_ERRNO_IN_MESSAGE = re.compile(r"\(os error (\d+)\)|\[os_error_code='(\d+)'\]")  # Rust's io::Error; tensorstore's


class StorageError(ConfigError):
    """A file could not be written (no space, read-only, quota, permission, a file where a folder should be)."""


def cause(e: BaseException) -> OSError | None:
    """The storage OSError behind `e` (itself, or in its chain of causes), if there is one. A Rust library's I/O
    error (safetensors, tokenizers) or tensorstore's (orbax) is no OSError but its message ends with the errno."""
    while e is not None:
        if isinstance(e, OSError) and e.errno in ERRNOS:
            return e
        code = None if isinstance(e, OSError) else _ERRNO_IN_MESSAGE.search(str(e))
        if code and int(code[1] or code[2]) in ERRNOS:
            return OSError(int(code[1] or code[2]), os.strerror(int(code[1] or code[2])))
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
    return None


@contextlib.contextmanager
def _naming(path):
    """An OSError raised inside names `path` (a failed write() or close() names no file)."""
    try:
        yield
    except OSError as e:
        if e.filename is not None:
            raise
        raise OSError(e.errno, e.strerror, str(path)) from None


def write_file(path: str | os.PathLike, data) -> None:
    """Writes `data` (bytes, or an array's buffer) to `path`; an OSError names `path`."""
    with _naming(path), open(path, "wb") as f:
        f.write(data)


def replace_file(path: str | os.PathLike, data: bytes | str) -> None:
    """Writes `data` (bytes, or text as UTF-8) to `path` whole or not at all: into `.NAME.part` beside it, then
    renamed over it (a rename within a folder is atomic on POSIX), so a full or read-only disk leaves the old file or
    none, never a part of one that a rerun would read. An OSError names `path`; the part is removed."""
    path = os.fspath(path)
    part = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.part")
    try:
        write_file(part, data.encode() if isinstance(data, str) else data)
        os.replace(part, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(part)
        raise OSError(e.errno, e.strerror, path) from None


class Appending:
    """A new file at `path` written piece by piece (`write(data)`, bytes or an array's buffer); a failed open, write
    or close raises an OSError naming `path`. A context manager that closes it."""

    def __init__(self, path: str | os.PathLike):
        self.path = path
        with _naming(path):
            self.file = open(path, "wb")  # closed by __exit__

    def write(self, data) -> None:
        with _naming(self.path):
            self.file.write(data)

    def __enter__(self) -> Appending:
        return self

    def __exit__(self, *exc) -> None:
        with _naming(self.path):
            self.file.close()


def reason(e: OSError) -> str:
    return e.strerror or str(e)


@contextlib.contextmanager
def writing(what: str, advice: str):
    """A storage OSError inside becomes `StorageError("cannot write WHAT (PATH: REASON); ADVICE")`."""
    try:
        yield
    except Exception as e:
        found = cause(e)
        if found is None:
            raise
        path = f"{found.filename}: " if found.filename else ""
        raise StorageError(f"cannot write {what} ({path}{reason(found)}); {advice}") from None


class _OrbaxRecords(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "orbax" not in record.pathname


@contextlib.contextmanager
def quiet_orbax():
    """Orbax's own log records (absl's logger), which on a failed save are tracebacks from each of its threads, are
    dropped inside: the caller reports the failure."""
    logger, dropped = logging.getLogger("absl"), _OrbaxRecords()
    logger.addFilter(dropped)
    try:
        yield
    finally:
        logger.removeFilter(dropped)


def _closed_loop_report(report) -> bool:
    """Whether an unraisable exception is a write's completion posted to an asyncio loop already closed: what
    tensorstore's own threads (no Python object: report.object is None) print when orbax has closed the loop of a
    failed save while its other writes were still in flight."""
    e, tb = report.exc_value, traceback.extract_tb(report.exc_traceback)
    closed = isinstance(e, RuntimeError) and str(e) == "Event loop is closed" and report.object is None
    return closed and bool(tb) and tb[-1].name == "_check_closed" and "asyncio" in tb[-1].filename


class _UnretrievedWriteErrors(logging.Filter):
    """asyncio's "... exception was never retrieved" of a storage error: the failed save's other writes, their
    futures collected after the save reported the failure."""

    def filter(self, record: logging.LogRecord) -> bool:
        unretrieved = "exception was never retrieved" in record.getMessage() and record.exc_info
        return not (unretrieved and cause(record.exc_info[1]) is not None)


def drop_stray_write_reports() -> None:
    """From now on this process drops what a failed checkpoint save's other writes report after it, from threads
    and garbage collection until they end (so not only inside a block): _closed_loop_report's unraisable
    exceptions and _UnretrievedWriteErrors' log records (bare tracebacks on stderr before and after the save's one
    line). Every other report goes where it went. Idempotent."""
    logger = logging.getLogger("asyncio")
    if not any(isinstance(f, _UnretrievedWriteErrors) for f in logger.filters):
        logger.addFilter(_UnretrievedWriteErrors())
    before = sys.unraisablehook
    if getattr(before, "drops_stray_write_reports", False):
        return

    def hook(report) -> None:
        if not _closed_loop_report(report):
            before(report)

    hook.drops_stray_write_reports = True
    sys.unraisablehook = hook


def sha256(path) -> str:
    """The hex SHA-256 of the file at `path` (hashlib.file_digest: read in blocks, never whole)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
