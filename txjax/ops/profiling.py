"""`train.profile_steps = "A:B"`: a jax.profiler trace of the training steps after step A up to step B (B - A steps),
written into WORKDIR/profile/ (plugins/profile/<date>/*.xplane.pb for TensorBoard's profile plugin, and
*.trace.json.gz, which Perfetto opens), and the table of its costliest XLA ops (`top_ops`) printed when it ends.
Steps after a resume count from the resumed step as always."""

from __future__ import annotations

import collections
import gzip
import json
import re
from pathlib import Path

import jax

PROFILE_DIR = "profile"
CONTROL_FLOW = re.compile(r"(while|conditional|call)(\.\d+)?$")


def parse_steps(text: str) -> tuple[int, int] | None:
    """ "A:B" -> (A, B) with 0 <= A < B; "" -> None (no profile); anything else a one-line ValueError."""
    if not text:
        return None
    first, colon, last = text.partition(":")
    if not (colon and first.isdigit() and last.isdigit() and int(first) < int(last)):
        raise ValueError(f"config.train.profile_steps={text!r}: expected A:B with 0 <= A < B, e.g. 20:25")
    return int(first), int(last)


def top_ops(directory, n: int = 10) -> list[dict]:
    """The n XLA ops with the most time in the newest trace under `directory` (its *.trace.json.gz): per op (the
    HLO instruction name, e.g. fusion.12, and its module) the summed duration in ms, the number of calls and the
    share of all op time in the trace. Each op event of XLA's thunk executor names its HLO op in its args; the
    control-flow ops (while, conditional, call) are left out, since their events span the ops they run."""
    traces = sorted(Path(directory).glob("**/*.trace.json.gz"), key=lambda p: p.stat().st_mtime)
    if not traces:
        raise FileNotFoundError(f"no *.trace.json.gz under {directory}")
    events = json.loads(gzip.decompress(traces[-1].read_bytes()))["traceEvents"]
    total_us, calls = collections.Counter(), collections.Counter()
    for e in events:
        args = e.get("args") or {}
        if e.get("ph") == "X" and "hlo_op" in args and not CONTROL_FLOW.match(args["hlo_op"]):
            key = (args["hlo_op"], args.get("hlo_module", ""))
            total_us[key] += e.get("dur", 0.0)
            calls[key] += 1
    all_us = sum(total_us.values()) or 1.0
    return [
        {"op": op, "module": module, "ms": us / 1e3, "calls": calls[op, module], "share": us / all_us}
        for (op, module), us in total_us.most_common(n)
    ]


def format_ops(rows: list[dict]) -> str:
    """top_ops rows as lines: share, ms, calls, op (module)."""
    return "\n".join(f"{r['share']:6.1%} {r['ms']:9.2f} ms {r['calls']:6d}x  {r['op']} ({r['module']})" for r in rows)


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
        """Stops a trace still running (a run that ended or stopped before step B) and prints its top ops."""
        if self.running:
            jax.profiler.stop_trace()
            self.running = False
            print(f"[profile] {self.directory}: the costliest XLA ops of the traced steps", flush=True)
            print(format_ops(top_ops(self.directory)), flush=True)
