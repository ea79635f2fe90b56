"""The user-error type every wing raises (ground floor: imports nothing of txjax, so any wing may raise it)."""


class ConfigError(ValueError):
    """A user error in an experiment config or flag: reported as one line, no traceback."""
