"""Training: the jitted train_step and the loop around it (resume, checkpoints, evals, logs, time budget).

train_step(state, batch) -> (state, metrics), compiled once, the state's buffers donated:
    g = grad_theta(sum_t w_t CE_t^eps) / sum_t w_t     numerator summed over the grad_accum micro-batches in a
                                                       lax.scan before the one division: the full batch's gradient
    theta, opt_state <- AdamW(clip(g))                 (txjax.train_state)
Step s draws dropout masks from fold_in(dropout key, s), batch k is a pure function of (seed, k) and checkpoints
hold the whole state, so a resumed run takes the same steps as one that never stopped (bit for bit on CPU).
The loop reads values back from the device only every log_every steps and before a save or an eval, and runs at
most 8 steps ahead of the device (distributed.InFlight: more deadlock XLA:CPU meshes). Each logged interval
records ms_per_step, tokens_per_s and
    mfu = model FLOPs per step / seconds per step / (devices x peak FLOP/s of one device in model.dtype)
with the FLOPs from the batch shape (summary.train_flops_per_batch) and the peak measured once per device kind
(txjax.peak.peak_gflops, cached).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from time import monotonic

import jax
import jax.numpy as jnp
import ml_collections
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from txjax import config as config_lib
from txjax import distributed, init_from
from txjax.checkpoint import Checkpointer
from txjax.data import prefetch
from txjax.distributed import InFlight, barrier, first_device_mesh, is_lead, run_mesh
from txjax.evaluate import eval_batches, evaluate, generation_metrics, make_eval_step, write_metrics
from txjax.experiment import (
    CHECKPOINT_DIR,
    Run,
    build_dataset,
    build_model,
    build_tokenizer,
    fill_model_sizes,
    load_workdir,
)
from txjax.metrics_log import MetricsLog
from txjax.objective import batch_keys, forward, token_sums
from txjax.peak import peak_gflops
from txjax.sharding import batch_sharding, global_batch, process_rows
from txjax.summary import train_flops_per_batch
from txjax.train_state import TrainState, current_learning_rate, init_state, make_optimizer, run_keys, state_shardings

__all__ = [
    "TrainState",
    "Diverged",
    "load_workdir",
    "make_train_step",
    "train_step_function",
    "prepare",
    "save_config",
    "peak_flops_per_s",
    "train",
    "main",
]


class Diverged(RuntimeError):
    """The loss or the parameters became NaN or infinite; the last checkpoint saved before that is kept."""


def make_train_step(model, tx: optax.GradientTransformation, t: ml_collections.ConfigDict, mesh: Mesh | None = None):
    """jit(train_step, donate_argnums=0) for `model`, optimizer `tx` and t = config.train, on `mesh` (default: the
    first device): the state laid out as train_state.state_shardings, the batch's rows split over data x fsdp."""
    mesh = mesh or first_device_mesh()
    state_sharding = state_shardings(model, tx, t.seed, mesh)
    train_step = train_step_function(model, tx, t)
    dropout_key = run_keys(t.seed)[1]
    return jax.jit(
        lambda state, batch: train_step(state, batch, dropout_key),
        in_shardings=(state_sharding, batch_sharding(mesh)),
        out_shardings=(state_sharding, NamedSharding(mesh, P())),
        donate_argnums=0,
    )


def train_step_function(model, tx: optax.GradientTransformation, t: ml_collections.ConfigDict):
    """The pure train_step(state, batch, dropout_key) -> (state, metrics), to jit, or to vmap over runs.

    Everything that may differ between runs (parameters, optimizer hyperparameters, batch, dropout key) is an argument.
    """
    dropout = model.cfg.dropout > 0 or model.cfg.attention_dropout > 0

    def objective_sum(params, batch, rng):
        sums = token_sums(*forward(model, params, batch, rng if dropout else None), t.label_smoothing)
        return sums["objective"], sums

    grad_sums = jax.grad(objective_sum, has_aux=True)

    def train_step(state: TrainState, batch, dropout_key):
        rng = jax.random.fold_in(dropout_key, state.step)
        if t.grad_accum == 1:
            grads, sums = grad_sums(state.params, batch, rng)
        else:  # micro-batch i holds rows i, i + A, i + 2A, ...: on a data-parallel mesh every device has a share
            micro = jax.tree_util.tree_map(lambda x: x.reshape(-1, t.grad_accum, *x.shape[1:]), batch)

            def add(total, i):
                one = jax.tree_util.tree_map(lambda x: x[:, i], micro)
                one_sums = grad_sums(state.params, one, jax.random.fold_in(rng, i))
                return jax.tree_util.tree_map(jnp.add, total, one_sums), None

            shapes = jax.eval_shape(grad_sums, state.params, jax.tree_util.tree_map(lambda x: x[:, 0], micro), rng)
            zeros = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
            (grads, sums), _ = jax.lax.scan(add, zeros, jnp.arange(t.grad_accum))
        weight = jnp.maximum(sums["weight"], 1.0)
        grads = jax.tree_util.tree_map(lambda g: g / weight, grads)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        finite = jnp.stack([jnp.isfinite(sums["loss"])] + [jnp.isfinite(p).all() for p in jax.tree.leaves(params)])
        return TrainState(step=state.step + 1, params=params, opt_state=opt_state), {
            "loss": sums["loss"] / weight,
            "token_accuracy": sums["correct"] / weight,
            "grad_norm": optax.tree.norm(grads),
            "finite": finite.all(),
            "learning_rate": current_learning_rate(state.opt_state, state.step),
        }

    return train_step


def train(config: ml_collections.ConfigDict, workdir: str | Path) -> dict:
    """Trains the run in `workdir`, resuming from its latest checkpoint; returns the final metrics."""
    workdir = Path(workdir)
    tokenizer, train_data, valid_data = prepare(config, workdir)
    ckpt = Checkpointer(workdir / CHECKPOINT_DIR, config.train.keep_checkpoints)
    try:
        save_config(config, workdir, ckpt)
        return _loop(config, workdir, tokenizer, train_data, valid_data, ckpt)
    finally:
        ckpt.close()


def prepare(config: ml_collections.ConfigDict, workdir: Path):
    """(tokenizer, train, valid) of a run; the tokenizer saved in `workdir`, the model sizes filled into `config`."""
    workdir.mkdir(parents=True, exist_ok=True)
    if config.train.get("init_from"):  # fine-tuning: the source's model section and tokenizer
        init_from.adopt_model(config, workdir, lead=is_lead())
        barrier("init_from")
    with config_lib.user_errors():
        tokenizer = build_tokenizer(config, workdir) if is_lead() else None
        barrier("tokenizer")  # the other processes load the one process 0 built and saved
        tokenizer = build_tokenizer(config, workdir) if tokenizer is None else tokenizer
        train_data = build_dataset(config, tokenizer, "train")
        valid_data = build_dataset(config, tokenizer, "valid")
        fill_model_sizes(config, tokenizer, train_data)
    return tokenizer, train_data, valid_data


def save_config(config: ml_collections.ConfigDict, workdir: Path, ckpt: Checkpointer) -> None:
    """Writes the resolved config into `workdir`, after checking that a run resuming from `ckpt` keeps its config."""
    if ckpt.latest_step() is not None:
        config_lib.check_resumable(config_lib.load(workdir), config, workdir)
    if is_lead():
        config_lib.save(config, workdir)


def peak_flops_per_s(dtype: str, devices: int) -> float | None:
    """The MFU denominator: `devices` x the measured matmul ceiling of one device in the compute `dtype`
    (txjax.peak.peak_gflops, FLOP/s); None, with a warning, when measuring it fails (the run then logs no mfu)."""
    try:
        return 1e9 * peak_gflops()[dtype] * devices
    except Exception as e:  # a diagnostic: never a reason to stop training
        print(
            f"warning: mfu not logged: measuring the matmul peak failed ({type(e).__name__}: {e})",
            file=sys.stderr,
            flush=True,
        )
        return None


def _loop(config, workdir: Path, tokenizer, train_data, valid_data, ckpt: Checkpointer) -> dict:
    t = config.train
    model, tx, mesh = build_model(config), make_optimizer(t), run_mesh(config.mesh)
    peak = peak_flops_per_s(config.model.dtype, mesh.devices.size)
    init = jax.jit(lambda: init_state(model, tx, t.seed), out_shardings=state_shardings(model, tx, t.seed, mesh))
    saved = ckpt.latest_step()
    if saved is not None:
        state = ckpt.restore(jax.eval_shape(init))
    else:
        state = init_from.initial_state(config, model, tx, mesh) if t.get("init_from") else init()
    start = int(state.step)
    if saved is not None:
        print(f"resuming {workdir} from step {start}", flush=True)
    train_step, eval_step = make_train_step(model, tx, t, mesh), make_eval_step(model, mesh)
    exact_match = config.data.kind == "synthetic"
    flops = train_flops_per_batch(model.cfg, config.family, train_data.batch(t.seed, start, t.batch_size))
    log = MetricsLog(workdir, t.steps, start, lead=is_lead(), flops_per_step=flops, peak_flops_per_s=peak)
    rows = process_rows(mesh, t.batch_size)  # this process builds only its rows of each global batch
    batches = prefetch(
        global_batch(train_data.batch(t.seed, k, t.batch_size, rows), mesh) for k in range(start, t.steps)
    )
    tokens_key = batch_keys(model)[0][0]
    budget_s = 60.0 * t.max_minutes if t.max_minutes > 0 else math.inf
    every_s = 60.0 * t.eval_every_minutes if t.eval_every_minutes > 0 else math.inf
    began, paused, next_eval_s = monotonic(), 0.0, every_s  # paused: seconds of evals and saves

    def valid_metrics(batches_to_read: int) -> dict:
        """Loss metrics over the valid split (or its first batches) and, with eval_generation, greedy BLEU/chrF or
        exact match of the whole split; the minutes trained so far (evals and saves not counted)."""
        trained_minutes = (monotonic() - began - paused) / 60.0
        batches = eval_batches(valid_data, t.batch_size, batches_to_read, mesh)
        metrics = evaluate(eval_step, state.params, batches, exact_match)
        if t.eval_generation:
            run = Run(config, model, tokenizer, state.params, step)
            generated = generation_metrics(run, valid_data, beam_size=1)
            metrics |= {k: v for k, v in generated.items() if not k.endswith("_signature")}
        return metrics | {"train_minutes": trained_minutes}

    step, pending, tokens, record, in_flight = start, [], 0, None, InFlight()
    try:
        for step, batch in zip(range(start + 1, t.steps + 1), batches):  # step: optimizer steps done after it
            state, metrics = train_step(state, batch)
            pending.append(in_flight.add(metrics))
            tokens += batch[tokens_key].size
            trained_s = monotonic() - began - paused
            last = step == t.steps or trained_s > budget_s
            save = last or step % t.checkpoint_every == 0
            timed_eval = trained_s >= next_eval_s
            if timed_eval:  # the next multiple of every_s after now
                next_eval_s = every_s * (trained_s // every_s + 1)
            eval_now = not last and (timed_eval or (t.eval_every > 0 and step % t.eval_every == 0))
            if save or eval_now or step % t.log_every == 0:
                record, pending, tokens = log.train(step, pending, tokens), [], 0
                if record["finite"] < 1:
                    log.close()
                    raise Diverged(
                        f"the loss or the parameters became NaN/inf by step {step} (recent mean loss "
                        f"{record['loss']}); training stopped and the last good "
                        f"checkpoint (step {saved}) is kept in {ckpt.directory}. Lower "
                        "--config.train.learning_rate or set --config.train.grad_clip"
                    )
            paused_from = monotonic()
            if eval_now:
                log.write(step, "valid", valid_metrics(t.eval_batches))
            if save:
                ckpt.save(step, state)
                saved = step
            if eval_now or save:
                paused += monotonic() - paused_from
                log.restart_clock()
            if last:
                break
    finally:
        batches.close()
    final = valid_metrics(0)
    log.write(step, "valid", final)
    log.close()
    if is_lead():
        write_metrics(workdir, "valid", {"split": "valid", "step": step, **final})
    return {
        "step": step,
        **({"train_loss": record["loss"]} if record else {}),
        **{f"valid_{k}": v for k, v in final.items() if k != "train_minutes"},
        "wall_minutes": (monotonic() - began) / 60.0,
        "train_minutes": final["train_minutes"],
        "ms_per_step_median": log.median_ms_per_step(),
        "train_step_compiles": train_step._cache_size(),
        "eval_step_compiles": eval_step._cache_size(),
    }


def main(argv: list[str]) -> None:
    """run.py train [--config=experiments/NAME.py] [--workdir=DIR] [--config.SECTION.FIELD=VALUE ...]"""
    parser = argparse.ArgumentParser(prog="run.py train", description=main.__doc__, allow_abbrev=False)
    parser.add_argument("--config", help=f"experiment file (default: {config_lib.DEFAULT_EXPERIMENT.name})")
    parser.add_argument("--workdir", help="run folder (default: runs/<experiment name>); resumes if it has one")
    distributed.add_flags(parser)
    args, overrides = parser.parse_known_args(argv)
    for flag in overrides:
        if not flag.startswith("--config."):
            parser.error(f"unrecognized argument {flag}")
    config = config_lib.from_command_line(args.config, overrides, args.workdir)
    distributed.initialize(args)
    workdir = args.workdir or Path("runs") / Path(args.config or config_lib.DEFAULT_EXPERIMENT).stem
    result = train(config, workdir)
    if is_lead():
        print(json.dumps(result))
