"""A run's logs: JSON lines, a progress bar (or plain lines off a terminal), a PNG of the curves, and the same records
to the run's other trackers (TensorBoard events, W&B, MLflow: txjax.ops.trackers).

`metrics.jsonl` holds one object per line: {"step": s, "split": "train" | "valid", metric: value, ...}. When a
run resumes from step s, the lines past s (written by the run that was killed) are dropped first, so the file
always tells one history. A resume that changed settings adds {"step": s, "split": "config", "changes": {field:
[old, new]}} (txjax.training.resume).
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path

import jax
import numpy as np
from tqdm import tqdm

from txjax.ops.trackers import Trackers

METRICS_FILE = "metrics.jsonl"
CURVES_FILE = "curves.png"


_observers: list = []  # observe()'s callables


@contextlib.contextmanager
def observe(fn):
    """While inside, fn(workdir, step, split, record) is called after every record a MetricsLog writes: how a
    sweep's Ray trial reports its evals to Tune (txjax.sweep.ray_launcher) without a hook in the training loop."""
    _observers.append(fn)
    try:
        yield
    finally:
        _observers.remove(fn)


def read_metrics(workdir: str | Path) -> list[dict]:
    path = Path(workdir) / METRICS_FILE
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


class MetricsLog:
    """Writes what a training run measures; `train()` is the loop's only host-device synchronisation."""

    def __init__(
        self,
        workdir: str | Path,
        steps: int,
        start_step: int,
        lead: bool = True,
        flops_per_step: float | None = None,
        peak_flops_per_s: float | None = None,
        slots_per_step: int = 0,
        trackers: Trackers | None = None,
    ):
        """Only the `lead` process of a multi-process run writes; the others compute the same records. With the
        model FLOPs of a step and the peak FLOP/s of the run's devices (all of them together) given, every train
        record also holds mfu. `trackers` (the lead's) get every record written here and, at once, what they
        missed of the history kept (Trackers.catch_up)."""
        self.workdir, self.lead = Path(workdir), lead
        self.flops_per_step, self.peak_flops_per_s = flops_per_step, peak_flops_per_s
        self.slots_per_step = slots_per_step
        if lead:
            kept = [r for r in read_metrics(self.workdir) if r["step"] <= start_step]
            self.file = (self.workdir / METRICS_FILE).open("w")
            self.file.writelines(json.dumps(r) + "\n" for r in kept)
            self.file.flush()  # on disk at once: a resumed run reads which evals it owes (txjax.ops.preemption)
            if trackers is not None:
                trackers.catch_up(kept)
        self.trackers = trackers
        self.steps = steps
        self.bar = tqdm(
            total=steps, initial=start_step, unit="step", dynamic_ncols=True, disable=not (lead and sys.stderr.isatty())
        )
        self.last_step = start_step
        self.ms_per_step: list[float] = []  # one per logged interval
        self.restart_clock()

    def restart_clock(self) -> None:
        """Starts timing afresh (after an evaluation or a save, which are not training steps)."""
        self.last_time = time.perf_counter()

    def train(self, step: int, pending: list[dict]) -> dict:
        """Logs the mean of the per-step metrics since the last call (device arrays, fetched now) and the speed
        over the interval (the first one includes the compilation): ms_per_step; target_tokens_per_s, the tokens
        predicted with weight > 0 (each step's metrics carry their count, "target_tokens"); slots_per_s, every
        input position of every row (source, target and padding: `slots_per_step`, from the batch shape); and the
        model FLOPs utilisation when the constructor was given its terms:
            mfu = flops_per_step · steps / seconds / peak_flops_per_s"""
        host = jax.device_get(pending)
        now = time.perf_counter()
        n, dt = step - self.last_step, now - self.last_time
        record = {k: float(np.mean([m[k] for m in host])) for k in host[0]}
        record |= {"ms_per_step": 1000.0 * dt / n, "target_tokens_per_s": record.pop("target_tokens") * n / dt}
        record["slots_per_s"] = self.slots_per_step * n / dt
        postfix = {"loss": f"{record['loss']:.4f}", "tok_s": f"{record['target_tokens_per_s']:,.0f}"}
        if self.flops_per_step and self.peak_flops_per_s:
            record["mfu"] = self.flops_per_step * n / dt / self.peak_flops_per_s
            postfix["mfu"] = f"{record['mfu']:.2%}"
        self.last_step, self.last_time = step, now
        self.ms_per_step.append(record["ms_per_step"])
        self.bar.update(n)
        self.bar.set_postfix(postfix)
        self.write(step, "train", record)
        return record

    def median_ms_per_step(self) -> float | None:
        """The median over the logged intervals, leaving out the first (it includes the compilation)."""
        return float(np.median(self.ms_per_step[1:] or self.ms_per_step)) if self.ms_per_step else None

    def changed(self, step: int, changes: dict) -> None:
        """Records the settings a resumed run changed from `step` (txjax.training.resume) as a "config" line."""
        if self.lead:
            self.file.write(json.dumps({"step": step, "split": "config", "changes": changes}) + "\n")
            self.file.flush()
        if self.trackers is not None:
            self.trackers.changed(step, changes)

    def write(self, step: int, split: str, record: dict) -> None:
        if not self.lead:
            return
        self.file.write(json.dumps({"step": step, "split": split, **record}) + "\n")
        self.file.flush()
        if self.trackers is not None:
            self.trackers.log(step, split, record)
        for fn in _observers:
            fn(self.workdir, step, split, record)
        if self.bar.disable:
            shown = " ".join(f"{k} {v:.4g}" for k, v in record.items())
            print(f"[{split}] step {step}/{self.steps} {shown}", file=sys.stderr, flush=True)

    def close(self, status: str = "finished", result: dict | None = None) -> None:
        """Flushes the files, draws the loss curves of the whole history into curves.png and ends the trackers' runs
        (status finished | failed | stopped; `result`, the run's final metrics, as their result.json)."""
        self.bar.close()
        if self.lead:
            self.file.close()
            plot_curves(self.workdir)
        if self.trackers is not None:
            self.trackers.close(status, result)


def plot_curves(workdir: str | Path) -> Path:
    """Train and eval loss against step, from metrics.jsonl."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(workdir)
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    for split in dict.fromkeys(r["split"] for r in records):
        points = [(r["step"], r["loss"]) for r in records if r["split"] == split and "loss" in r]
        if points:
            ax.plot(*zip(*points), label=f"{split} loss", marker="o" if split != "train" else None, markersize=3)
    ax.set(xlabel="step", ylabel="cross-entropy (nats/token)", title=Path(workdir).resolve().name)
    ax.grid(alpha=0.3)
    ax.legend()
    path = Path(workdir) / CURVES_FILE
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return path
