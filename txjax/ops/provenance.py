"""Where and when a result was measured, written into every result file: a benchmark's
benchmarks/results/NAME_PLATFORM.json, a sweep's results.json, a run's eval_<split>.json.

These machines change kind between days (an AMD Zen 5 on one, an Intel Xeon with AMX on another) and timings move
by 2x between them, so a figure is only comparable with figures of the same CPU model; `benchmarks/readme_tables.py`
labels every figure in README.md and docs/ with the machine of the file it came from. The load average says whether
other processes shared the cores (timings noisy; losses, perplexities and memory are not affected).
"""

from __future__ import annotations

import os
import platform
import subprocess
import time
from pathlib import Path

import jax

from txjax.ops.peak import peak_gflops

REPO = Path(__file__).resolve().parents[2]  # the repository root (config.py reads experiments/ from it)


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else the platform's processor."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def commit() -> str | None:
    """The checkout's commit (with "+changes" when files differ from it), None outside a git checkout."""
    try:
        run = lambda *a: subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True, check=True).stdout
        head = run("rev-parse", "--short", "HEAD").strip()
        return head + ("+changes" if run("status", "--porcelain", "--untracked-files=no").strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return None


def _peak() -> dict | None:
    try:
        return peak_gflops()
    except Exception:  # a result file is still written when the peak cannot be measured; it says so with None
        return None


def machine(command: str) -> dict:
    """The date, the machine (CPU model, cores, device, the measured matmul peak in GFLOP/s), its load, the command
    and the commit of a result."""
    device = jax.devices()[0]
    return {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "cpu_model": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "platform": device.platform,
        "device_kind": device.device_kind,
        "devices": jax.device_count(),
        "matmul_peak_gflops": _peak(),
        "load_average_1min": os.getloadavg()[0],
        "jax": jax.__version__,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        **({"driver": device.client.platform_version} if device.platform == "gpu" else {}),
        "command": command,
        "commit": commit(),
    }
