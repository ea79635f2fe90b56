"""K runs trained together in one compiled program: jax.vmap of the ordinary train step over stacked states.

    states_K, metrics_K = jit(vmap(train_step))(states_K, batches_K, dropout_keys_K)
Runs may differ only in train.seed (parameters, batch order, dropout) and the optimizer's scalar settings
(txjax.train_state.HYPERPARAMS, held as arrays in each run's optimizer state); everything else is one program.
Each run keeps its own workdir with the normal outputs (config.json, tokenizer/, checkpoints/, metrics.jsonl, tb/,
curves.png, eval_valid.json), so `run.py eval` and a resumed single run treat it like any other, and the
results equal those of the runs trained one by one (up to float reassociation in the batched matmuls).
A run whose loss turns non-finite stops being logged and saved; the others go on.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from txjax import preemption, workdir_lock
from txjax.checkpoint import Checkpointer
from txjax.data import prefetch
from txjax.evaluate import eval_batches, evaluate, make_eval_step, write_metrics
from txjax.experiment import CHECKPOINT_DIR, build_model
from txjax.metrics_log import MetricsLog
from txjax.objective import batch_keys
from txjax.train import Diverged, prepare, save_config, train_step_function
from txjax.train_state import HYPERPARAMS, init_state, make_optimizer, run_keys

VMAPPABLE = ("train.seed",) + tuple(f"train.{name}" for name in HYPERPARAMS)


def group_key(config: ml_collections.ConfigDict) -> str | None:
    """Runs whose configs have equal keys can be trained together: they differ only in VMAPPABLE fields. None for a
    run that cannot share a program (a mesh of several devices: vmapped runs live on one device) or that asks for
    what only the single-run loop does (a training-time budget, evals by training time, decoding during training)."""
    t = config.train
    if (
        math.prod(config.mesh.values()) > 1
        or jax.process_count() > 1
        or t.max_minutes
        or t.eval_every_minutes
        or t.eval_generation
    ):
        return None
    shared = config.to_dict()
    for field in VMAPPABLE:
        section, name = field.split(".")
        del shared[section][name]
    return json.dumps(shared, sort_keys=True)


def train_group(configs: list[ml_collections.ConfigDict], workdirs: list[str | Path]) -> list[dict | Exception]:
    """Trains the runs together, resuming from the last step all of them saved; per run: the final metrics (as
    `txjax.train.train` returns them) or the Diverged error that stopped it."""
    if len({group_key(c) for c in configs}) != 1 or group_key(configs[0]) is None:
        raise ValueError(f"runs trained together may differ only in {', '.join(VMAPPABLE)}")
    workdirs = [Path(w) for w in workdirs]
    with contextlib.ExitStack() as held:  # one writer per workdir; SIGTERM/SIGINT stop with a checkpoint
        for workdir in workdirs:
            held.enter_context(workdir_lock.hold(workdir))
        held.enter_context(preemption.watch())
        prepared = [prepare(c, w) for c, w in zip(configs, workdirs)]  # each folder gets its tokenizer
        _, train_data, valid_data = prepared[0]  # the runs share their data
        ckpts = [Checkpointer(w / CHECKPOINT_DIR, c.train.keep_checkpoints) for c, w in zip(configs, workdirs)]
        try:
            for config, workdir, ckpt in zip(configs, workdirs, ckpts):
                save_config(config, workdir, ckpt)
            return _loop(configs, workdirs, train_data, valid_data, ckpts)
        finally:
            for ckpt in ckpts:
                ckpt.close()


@jax.jit
def stack(trees: list):
    """[tree_1, ..., tree_K] -> one tree with a leading run axis K on every leaf (one compiled program)."""
    return jax.tree_util.tree_map(lambda *leaves: jnp.stack(leaves), *trees)


@jax.jit
def unstack(tree, k):
    """Run k's tree out of a stacked one."""
    return jax.tree_util.tree_map(lambda leaf: leaf[k], tree)


def _stack_batches(batches: list[dict]) -> dict:
    return jax.tree_util.tree_map(lambda *rows: np.stack(rows), *batches)


def _common_step(ckpts: list[Checkpointer]) -> int:
    """The last step every run has a checkpoint of (0: start afresh)."""
    steps = set.intersection(*(set(c.manager.all_steps()) for c in ckpts))
    return max(steps, default=0)


def _initial_states(model, configs, ckpts, start: int):
    """The runs' stacked states at `start`: restored from their checkpoints, or drawn afresh (start 0) in one
    vmapped program, each run with its own seed and optimizer hyperparameters."""
    t = configs[0].train
    if start:
        abstract = jax.eval_shape(lambda: init_state(model, make_optimizer(t), t.seed))
        return stack([ckpt.restore(abstract, start) for ckpt in ckpts])
    hyperparams = {name: jnp.asarray([c.train[name] for c in configs]) for name in HYPERPARAMS}
    seeds = jnp.asarray([c.train.seed for c in configs])
    init = jax.vmap(lambda seed, h: init_state(model, make_optimizer({**t.to_dict(), **h}), seed))
    return jax.jit(init)(seeds, hyperparams)


def _loop(configs, workdirs, train_data, valid_data, ckpts) -> list[dict | Exception]:
    t, runs = configs[0].train, range(len(configs))
    model = build_model(configs[0])
    start = _common_step(ckpts)
    states = _initial_states(model, configs, ckpts, start)
    if start:
        print(f"resuming {len(configs)} runs from step {start}", flush=True)
    seeds = [c.train.seed for c in configs]
    dropout_keys = jax.vmap(lambda seed: run_keys(seed)[1])(jnp.asarray(seeds))
    train_step = jax.jit(jax.vmap(train_step_function(model, make_optimizer(t), t)), donate_argnums=0)
    eval_step, exact_match = make_eval_step(model), configs[0].data.kind == "synthetic"
    logs = [MetricsLog(w, t.steps, start) for w in workdirs]
    batches = prefetch(
        jax.device_put(_stack_batches([train_data.batch(s, k, t.batch_size) for s in seeds]))
        for k in range(start, t.steps)
    )
    tokens_key = batch_keys(model)[0][0]
    began, step, pending, tokens, records, failed = time.monotonic(), start, [], 0, {}, {}
    alive = lambda: [k for k in runs if k not in failed]

    def valid_metrics(k: int) -> dict:  # run k's periodic eval
        batches = preemption.interruptible(eval_batches(valid_data, t.batch_size, t.eval_batches))
        return evaluate(eval_step, unstack(states.params, k), batches, exact_match)

    for k in runs:
        if preemption.owed_eval(workdirs[k], start, t):  # a signal cut it short: it comes before the steps after it
            logs[k].write(start, "valid", valid_metrics(k))
    try:
        for step, batch in zip(range(start + 1, t.steps + 1), batches):
            states, metrics_K = train_step(states, batch, dropout_keys)
            pending.append(metrics_K)
            tokens += batch[tokens_key][0].size
            last = preemption.stop_at(step, sync=False) or step == t.steps  # a signal: save this step, then stop
            save = last or step % t.checkpoint_every == 0
            eval_now = not last and t.eval_every > 0 and step % t.eval_every == 0
            if save or eval_now or step % t.log_every == 0:
                host = jax.device_get(pending)
                for k in alive():
                    records[k] = logs[k].train(step, [{n: v[k] for n, v in m.items()} for m in host], tokens)
                    if records[k]["finite"] < 1:
                        failed[k] = Diverged(
                            f"the loss or the parameters became NaN/inf by step {step}; {ckpts[k].last_good()}"
                        )
                        logs[k].close()
                pending, tokens = [], 0
            if eval_now:
                for k in alive():
                    logs[k].write(step, "valid", valid_metrics(k))
                for k in alive():
                    logs[k].restart_clock()
            if save:
                for k in alive():
                    ckpts[k].save(step, unstack(states, k))
            if last or not alive():
                break
        preemption.raise_if_stopped()
    except preemption.Preempted:  # saved unless a signal cut an eval short; train_group waits for it on the way out
        for k in alive():
            if ckpts[k].last_good_step != step:
                ckpts[k].save(step, unstack(states, k))
        raise
    finally:
        batches.close()
    results = dict(failed)
    for k in alive():
        final = evaluate(eval_step, unstack(states.params, k), eval_batches(valid_data, t.batch_size), exact_match)
        logs[k].write(step, "valid", final)
        logs[k].close()
        write_metrics(workdirs[k], "valid", {"split": "valid", "step": step, **final})
        results[k] = {
            "step": step,
            **({"train_loss": records[k]["loss"]} if k in records else {}),
            **{f"valid_{name}": v for name, v in final.items()},
            "wall_minutes": (time.monotonic() - began) / 60.0,
            "ms_per_step_median": logs[k].median_ms_per_step(),
            "runs_vmapped": len(configs),
        }
    return [results[k] for k in runs]
