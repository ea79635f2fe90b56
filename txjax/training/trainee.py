"""What the training loop (txjax.training.loop) asks of what it trains: one run (txjax.training.run.Run) or R runs
stacked under jax.vmap (txjax.training.stack.StackedRuns). The loop sees nothing else of either; a test holds both
to this Protocol (tests/test_train.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from txjax.sections.train import TrainConfig


@runtime_checkable
class Trainee(Protocol):
    t: TrainConfig  # the training settings (stacked runs share all but the vmappable ones)
    workdir: Path  # where progress is printed from (stacked: the first run's)
    size: int  # runs trained by one program: 1, or R stacked
    exact_match: bool  # evals score exact match (synthetic tasks)
    train_step: Callable  # (state, batch) -> (state, metrics): the jitted step, set by compile

    @property
    def name(self) -> str: ...

    def open_checkpoints(self) -> list: ...  # each run's Checkpointer, closed by the loop's caller

    def resolve(self, start: int) -> Any: ...  # settings changed on resume: refused, or applied and recorded

    def build(self) -> tuple: ...  # (model, mesh)

    def compile(self, model, mesh) -> None: ...  # the jitted init and train step

    def start(self, step: int) -> Any: ...  # the state at `step`: fresh (or init_from) at 0, else restored

    def measure(self, model, first, mesh) -> tuple: ...  # (FLOPs per step, peak FLOP/s or None, slots per step)

    def open_log(self, start: int, changes, flops: float, peak: float | None, slots: int) -> None: ...

    def batch(self, data, k: int) -> Any: ...  # batch k of this process's rows (stacked: each run's, stacked)

    def owed_eval(self, start: int, state, valid) -> None: ...  # the eval a signal cut short, before any step

    def logged(self, step: int, pending: list) -> bool: ...  # log the interval; False when every run diverged

    def evaluate(self, step: int, state, valid) -> None: ...

    def save(self, step: int, state) -> None: ...

    def restart_clock(self) -> None: ...  # after an eval or a save: throughput counts training time only

    def stop(self, step: int, state) -> None: ...  # a signal: save `step` unless saved

    def compiles(self) -> int: ...  # compilations of the train step

    def finish(self, step: int, state, start: int, valid, wall_minutes, program: dict) -> Any: ...
