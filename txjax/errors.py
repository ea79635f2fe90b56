"""The user-error type every wing raises (ground floor: imports nothing of txjax, so any wing may raise it), and the
one line of a path that loops (found in the flags at the edge: check_symlink_loops)."""

import errno
import os
import re


class ConfigError(ValueError):
    """A user error in an experiment config or flag: reported as one line, no traceback."""


def symlink_loop_line(error: BaseException) -> str | None:
    """The one line of a path whose symbolic links lead back to themselves (pathlib's RuntimeError "Symlink loop
    from ..." up to Python 3.12, OSError ELOOP from the OS and later pathlib), else None."""
    if isinstance(error, OSError) and error.errno == errno.ELOOP:
        path = error.filename
    elif isinstance(error, RuntimeError) and (found := re.fullmatch(r"Symlink loop from (.*)", str(error))):
        path = found.group(1).strip("'\"")
    else:
        return None
    return f"{path} is a loop of symbolic links (it leads back to itself): remove the link or give another path"


def check_symlink_loops(argv: list[str]) -> None:
    """OSError ELOOP for the first flag value (`--name=value`) that is a path through a loop of symbolic links, found
    at the edge: from Python 3.13 pathlib resolves such a path without a word (and is_file() is then merely False)."""
    for value in (arg.partition("=")[2] for arg in argv if arg.startswith("--")):
        try:
            os.stat(value)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), value) from None
        except ValueError:  # a NUL byte: not a path
            pass
