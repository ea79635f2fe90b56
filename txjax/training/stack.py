"""R runs stacked on a leading run axis and trained together under jax.vmap on one device, by the one training
loop (txjax.training.loop) that trains a single run:

    states_R, metrics_R = jit(vmap(train_step))(states_R, batches_R, dropout_keys_R)

Stacked runs may differ only in train.seed (parameters, batch order, dropout) and the optimizer's scalar settings
(txjax.state.optim.HYPERPARAMS, held as arrays in each run's optimizer state); everything else is one program, and
their results equal those of the runs trained one by one (up to float reassociation in the batched matmuls).
`StackedRuns` is a Trainee (txjax.training.trainee) as txjax.training.run.Run is: the stacked state and program are
its own, and each run's workdir, checkpoints, logs and evaluations stay that run's, handed its part of every tree.
This is the one place that knows R.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.sharding import Mesh

from txjax.state.optim import HYPERPARAMS
from txjax.state.train_state import init_state, optimizer, run_keys, start_state
from txjax.training import init_from
from txjax.training.edge import VMAPPABLE
from txjax.training.loop import drive
from txjax.training.run import Run
from txjax.training.step import train_step_function


def train_runs(configs: list[ml_collections.ConfigDict], workdirs: list[str | Path]) -> list[dict | Exception]:
    """Trains the runs together (one: as it is; more: stacked, see edge.group_key), resuming from the last step all
    of them saved; per run, the final metrics or the Diverged error that stopped it."""
    if len(configs) == 1:
        return [drive(configs, workdirs, lambda runs: runs[0])]
    return drive(configs, workdirs, StackedRuns)


@jax.jit
def stack(trees: list):
    """[tree_1, ..., tree_R] -> one tree with a leading run axis R on every leaf (one compiled program)."""
    return jax.tree_util.tree_map(lambda *leaves: jnp.stack(leaves), *trees)


@jax.jit
def unstack(tree, r):
    """Run r's tree out of a stacked one."""
    return jax.tree_util.tree_map(lambda leaf: leaf[r], tree)


class StackedRuns:
    """R runs on one device, every state and batch leaf with a leading run axis R; the settings they share are
    the first run's."""

    def __init__(self, runs: list[Run]):
        self.runs, self.size = runs, len(runs)
        self.t, self.workdir = runs[0].t, runs[0].workdir
        self.exact_match = runs[0].exact_match
        self.name = ", ".join(run.name for run in runs)

    def live(self) -> list[tuple[int, Run]]:
        """(r, run) of the runs that have not diverged."""
        return [(r, run) for r, run in enumerate(self.runs) if run.diverged is None]

    def build(self):
        """The first run's model and mesh: stacked runs share the model (edge.group_key)."""
        return self.runs[0].build()

    def open_checkpoints(self) -> list:
        return [ckpt for run in self.runs for ckpt in run.open_checkpoints()]

    def resolve(self, start: int) -> list[dict]:
        return [run.resolve(start) for run in self.runs]

    def compile(self, model, mesh: Mesh) -> None:
        """The one vmapped program (stacked runs live on the default device, whatever `mesh`)."""
        if len({run.spec.group for run in self.runs}) != 1 or self.runs[0].spec.group is None:
            raise ValueError(f"runs trained together may differ only in {', '.join(VMAPPABLE)}")
        self.model, self.seeds = model, [run.t.seed for run in self.runs]
        dropout_keys_R = jax.vmap(lambda seed: run_keys(seed)[1])(jnp.asarray(self.seeds))
        step = jax.vmap(train_step_function(model, optimizer(model, self.t.optim, self.t.lora), self.t))
        self._step = jax.jit(step, donate_argnums=0)
        self.train_step = lambda states, batch: self._step(states, batch, dropout_keys_R)

    def start(self, step: int):
        """The stacked states at `step`: restored from each run's checkpoint, or drawn afresh (step 0) in one vmapped
        program, each run with its own seed and optimizer hyperparameters."""
        model, o, lora = self.model, self.t.optim, self.t.lora
        if step:
            abstract = jax.eval_shape(
                lambda: init_state(model, optimizer(model, o, lora), self.t.seed, lora_config=lora)
            )
            return stack([run.restored(abstract, step) for run in self.runs])
        hyperparams = {
            name: jnp.asarray([run.t.optim.hyperparams()[name] for run in self.runs]) for name in HYPERPARAMS
        }
        tx = lambda h: optimizer(model, dataclasses.replace(o, **h), lora)
        if self.t.init_from:  # every run from the same imported parameters, each with its own fresh moments
            params = init_from.source_params(self.t.init_from)
            start = lambda seed, h: start_state(params, tx(h), model, seed, lora)
            return jax.jit(jax.vmap(start))(jnp.asarray(self.seeds), hyperparams)
        init = jax.vmap(lambda seed, h: init_state(model, tx(h), seed, lora_config=lora))
        return jax.jit(init)(jnp.asarray(self.seeds), hyperparams)

    def batch(self, data, k: int):
        batches = [data.batch(seed, k, self.t.batch_size) for seed in self.seeds]
        return jax.device_put(jax.tree_util.tree_map(lambda *rows: np.stack(rows), *batches))

    def compiles(self) -> int:
        return self._step._cache_size()

    def measure(self, model, first, mesh: Mesh) -> tuple[float, float | None, int]:
        """The figures of one run's step (Run.measure), the FLOPs R times: the runs share the device."""
        flops, peak, slots = self.runs[0].measure(model, first, mesh)
        return self.size * flops, peak, slots

    def open_log(self, start: int, changes: list[dict], flops: float, peak: float | None, slots: int) -> None:
        for run, changed in zip(self.runs, changes):
            run.open_log(start, changed, flops, peak, slots)

    def owed_eval(self, start: int, state, valid) -> None:
        for r, run in enumerate(self.runs):
            run.owed_eval(start, unstack(state, r), valid)

    def logged(self, step: int, pending: list[dict]) -> bool:
        """Each live run's log; False once every run diverged (the others go on)."""
        for r, run in self.live():
            run.logged(step, [unstack(m, r) for m in pending])
        return bool(self.live())

    def evaluate(self, step: int, state, valid) -> None:
        for r, run in self.live():
            run.evaluate(step, unstack(state, r), valid)

    def save(self, step: int, state) -> None:
        for r, run in self.live():
            run.save(step, unstack(state, r))

    def restart_clock(self) -> None:
        for _, run in self.live():
            run.restart_clock()

    def stop(self, step: int, state) -> None:
        for r, run in self.live():
            run.stop(step, unstack(state, r))

    def finish(self, step: int, state, start: int, valid, wall_minutes, program: dict) -> list[dict | Exception]:
        return [
            run.finish(step, unstack(state, r), start, valid, wall_minutes, program) for r, run in enumerate(self.runs)
        ]
