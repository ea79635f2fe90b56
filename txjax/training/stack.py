"""How R runs share one training program: one run as it is (on any mesh, any process count), or R > 1 runs stacked
on a leading run axis and trained together under jax.vmap on one device:

    states_R, metrics_R = jit(vmap(train_step))(states_R, batches_R, dropout_keys_R)

Stacked runs may differ only in train.seed (parameters, batch order, dropout) and the optimizer's scalar settings
(txjax.optim.HYPERPARAMS, held as arrays in each run's optimizer state); everything else is one program, and
their results equal those of the runs trained one by one (up to float reassociation in the batched matmuls).
`OneRun` and `StackedRuns` have the same methods, so txjax.training.loop's one loop serves both.
"""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.sharding import Mesh

from txjax import init_from
from txjax.checkpoint import Checkpointer
from txjax.config import ConfigError
from txjax.optim import HYPERPARAMS, make_optimizer
from txjax.sharding import global_batch, process_rows
from txjax.train_state import init_state, run_keys, state_shardings, with_hyperparams
from txjax.training.step import make_train_step, train_step_function

VMAPPABLE = ("train.seed",) + tuple(f"train.{name}" for name in HYPERPARAMS)


def group_key(config: ml_collections.ConfigDict) -> str | None:
    """Runs whose configs have equal keys can be stacked: they differ only in VMAPPABLE fields. None for a run that
    cannot share a program (a mesh of several devices or several processes: stacked runs live on one device)."""
    if math.prod(config.mesh.values()) > 1 or jax.process_count() > 1:
        return None
    shared = config.to_dict()
    for field in VMAPPABLE:
        section, name = field.split(".")
        del shared[section][name]
    return json.dumps(shared, sort_keys=True)


def common_step(ckpts: list[Checkpointer]) -> int:
    """The last step every run has a finished, undamaged checkpoint of (0: start afresh); ConfigError when there are
    checkpoints and all are damaged (txjax.checkpoint: each damaged step gets one warning line)."""
    steps = sorted(set.intersection(*(set(c.manager.all_steps()) for c in ckpts)), reverse=True)
    whole = next((s for s in steps if all([c.verified(s) for c in ckpts])), None)
    if steps and whole is None:
        raise ConfigError(
            f"no checkpoint of step {', '.join(map(str, steps))} in {', '.join(str(c.directory) for c in ckpts)} is "
            "whole (see the warnings); move the checkpoints folder away to start the run afresh"
        )
    return whole or 0


class OneRun:
    """One run: the state laid out on `mesh` by its logical axes, each process building its rows of every batch."""

    size = 1

    def __init__(self, model, config: ml_collections.ConfigDict, mesh: Mesh):
        t = self.train_config = config.train
        tx = make_optimizer(t, model.cfg)
        self.mesh, self.seed, self.rows = mesh, t.seed, process_rows(mesh, t.batch_size)
        shardings = state_shardings(model, tx, t.seed, mesh)
        self.init = jax.jit(lambda: init_state(model, tx, t.seed), out_shardings=shardings)
        self.first = self.init
        if t.get("init_from"):  # fine-tuning: another workdir's parameters, fresh moments
            self.first = lambda: init_from.initial_state(t.init_from, model, tx, mesh, shardings)
        self.train_step = make_train_step(model, tx, t, mesh)

    def start(self, ckpts: list[Checkpointer], step: int):
        """The state at `step`: at 0 drawn afresh (or train.init_from's), else restored (onto this mesh, whatever
        mesh wrote it) with the optimizer's hyperparameters of this config (applied from the resume step)."""
        if step == 0:
            return self.first()
        return with_hyperparams(ckpts[0].restore(jax.eval_shape(self.init), step), configured(self.train_config))

    def batch(self, data, k: int):
        return global_batch(data.batch(self.seed, k, self.train_config.batch_size, self.rows), self.mesh)

    def of(self, tree, r: int):
        """Run r's part of a state, parameters or metrics tree."""
        return tree

    def compiles(self) -> int:
        """How often the train step was compiled (1 unless a shape changed)."""
        return self.train_step._cache_size()


class StackedRuns:
    """R runs on one device, every state and batch leaf with a leading run axis R."""

    def __init__(self, model, configs: list[ml_collections.ConfigDict]):
        t = self.train_config = configs[0].train
        self.size, self.seeds = len(configs), [c.train.seed for c in configs]
        self.model, self.configs = model, configs
        dropout_keys_R = jax.vmap(lambda seed: run_keys(seed)[1])(jnp.asarray(self.seeds))
        step = jax.vmap(train_step_function(model, make_optimizer(t, model.cfg), t))
        self._step = jax.jit(step, donate_argnums=0)
        self.train_step = lambda states, batch: self._step(states, batch, dropout_keys_R)

    def start(self, ckpts: list[Checkpointer], step: int):
        """The stacked states at `step`: restored from each run's checkpoint, or drawn afresh (step 0) in one vmapped
        program, each run with its own seed and optimizer hyperparameters."""
        t = self.train_config
        if step:
            abstract = jax.eval_shape(lambda: init_state(self.model, make_optimizer(t, self.model.cfg), t.seed))
            restored = [ckpt.restore(abstract, step) for ckpt in ckpts]
            return stack([with_hyperparams(s, configured(c.train)) for s, c in zip(restored, self.configs)])
        hyperparams = {name: jnp.asarray([c.train[name] for c in self.configs]) for name in HYPERPARAMS}
        if t.get("init_from"):  # every run from the same imported parameters, each with its own fresh moments
            params = init_from.source_params(t.init_from)
            fresh = lambda h: init_from.fresh_state(params, make_optimizer({**t.to_dict(), **h}, self.model.cfg))
            return jax.jit(jax.vmap(fresh))(hyperparams)
        init = jax.vmap(
            lambda seed, h: init_state(self.model, make_optimizer({**t.to_dict(), **h}, self.model.cfg), seed)
        )
        return jax.jit(init)(jnp.asarray(self.seeds), hyperparams)

    def batch(self, data, k: int):
        batches = [data.batch(seed, k, self.train_config.batch_size) for seed in self.seeds]
        return jax.device_put(jax.tree_util.tree_map(lambda *rows: np.stack(rows), *batches))

    def of(self, tree, r: int):
        return unstack(tree, r)

    def compiles(self) -> int:
        return self._step._cache_size()


def configured(t) -> dict:
    """The optimizer's injected settings (optim.HYPERPARAMS) of t = config.train: a resumed run takes these, not the
    checkpoint's, so a changed learning rate or schedule applies from the resume step (txjax.training.resume)."""
    return {name: t[name] for name in HYPERPARAMS}


@jax.jit
def stack(trees: list):
    """[tree_1, ..., tree_R] -> one tree with a leading run axis R on every leaf (one compiled program)."""
    return jax.tree_util.tree_map(lambda *leaves: jnp.stack(leaves), *trees)


@jax.jit
def unstack(tree, r):
    """Run r's tree out of a stacked one."""
    return jax.tree_util.tree_map(lambda leaf: leaf[r], tree)


def layout(model, configs: list[ml_collections.ConfigDict], mesh: Mesh):
    """OneRun for one config, StackedRuns for several (which must share a group_key)."""
    if len(configs) == 1:
        return OneRun(model, configs[0], mesh)
    if len({group_key(c) for c in configs}) != 1 or group_key(configs[0]) is None:
        raise ValueError(f"runs trained together may differ only in {', '.join(VMAPPABLE)}")
    return StackedRuns(model, configs)
