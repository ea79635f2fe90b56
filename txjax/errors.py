"""The user-error type every wing raises (ground floor: imports nothing of txjax, so any wing may raise it), and the
one line of a path that loops."""

import errno
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
