"""`train.profile_steps = "A:B"`: a jax.profiler trace of the training steps after step A up to step B (B - A steps),
written into WORKDIR/profile/ (plugins/profile/<date>/*.xplane.pb for TensorBoard's profile plugin, and
*.trace.json.gz, which Perfetto opens). Steps after a resume count from the resumed step as always."""

from __future__ import annotations

from pathlib import Path

import jax

PROFILE_DIR = "profile"


def parse_steps(text: str) -> tuple[int, int] | None:
    """ "A:B" -> (A, B) with 0 <= A < B; "" -> None (no profile); anything else a one-line ValueError."""
    if not text:
        return None
    first, colon, last = text.partition(":")
    if not (colon and first.isdigit() and last.isdigit() and int(first) < int(last)):
        raise ValueError(f"config.train.profile_steps={text!r}: expected A:B with 0 <= A < B, e.g. 20:25")
    return int(first), int(last)


class StepProfiler:
    """Starts the trace before step A + 1 is dispatched and stops it once step B's outputs are computed."""

    def __init__(self, spec: str, workdir: Path):
        self.steps, self.directory, self.running = parse_steps(spec), Path(workdir) / PROFILE_DIR, False

    def before(self, step: int) -> None:
        if self.steps and step == self.steps[0] + 1:
            jax.profiler.start_trace(str(self.directory))
            self.running = True

    def after(self, step: int, outputs) -> None:
        if self.running and step == self.steps[1]:
            jax.block_until_ready(outputs)
            self.close()

    def close(self) -> None:
        """Stops a trace still running (a run that ended or stopped before step B)."""
        if self.running:
            jax.profiler.stop_trace()
            self.running = False
