"""What the workflow drivers of experiments/workflows/ share: `run.py` commands (or scripts) run from the repository
root as a user types them, echoed on stderr, their stdout returned, and the peak RSS of the process that ran them."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def measured(*args: str) -> tuple[str, float]:
    """Runs `python run.py ARGS` (or a script) from the repository root; returns its stdout and its process's peak
    RSS in MB (wait4's ru_maxrss: that process's own, not the driver's nor an earlier command's)."""
    argv = [sys.executable, *(args if args[0].endswith(".py") else ("run.py", *args))]
    print("$", shlex.join(["python", *argv[1:]]), file=sys.stderr, flush=True)
    process = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, text=True)
    stdout = process.stdout.read()  # to its end: the process has closed it
    _, status, usage = os.wait4(process.pid, 0)
    process.stdout.close()
    process.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
    if process.returncode:
        raise SystemExit(f"{shlex.join(argv[1:])} exited with {process.returncode}")
    return stdout, usage.ru_maxrss / 1024


def command(*args: str) -> str:
    """`measured`'s stdout alone."""
    return measured(*args)[0]


def last_json(stdout: str) -> dict:
    return json.loads(next(line for line in reversed(stdout.splitlines()) if line.startswith("{")))
