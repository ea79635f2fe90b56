"""Training: the one loop around the jitted train step (resume, checkpoints, evals, logs, time budget), for one run
or R runs stacked under jax.vmap (txjax.runs): every feature of the loop reaches sweeps as it reaches single runs.

Batch k is a pure function of (seed, k), step s draws its dropout masks from fold_in(dropout key, s) and
checkpoints hold the whole state, so a resumed run takes the same steps as one that never stopped (bit for bit on
CPU). The loop reads values back from the device only every log_every steps and before a save or an eval, and runs
at most 8 steps ahead of the device (distributed.InFlight: more deadlock XLA:CPU meshes). Each logged interval
records ms_per_step, target_tokens_per_s (tokens predicted with weight > 0), slots_per_s (every input position,
padding included) and
    mfu = model FLOPs per step / seconds per step / (devices x peak FLOP/s of one device in model.dtype)
with the FLOPs from the batch shape (summary.train_flops_per_batch; R stacked runs: R times one run's, since they
share the device) and the peak measured once per device kind (txjax.peak.peak_gflops, cached).
train.decay_start="budget" sizes the WSD decay by the time budget and ends the run where it ends (txjax.budget).
A run whose loss or parameters become non-finite stops (Diverged); in a stacked group the others go on. A run holds
its workdir's writer lock (txjax.workdir_lock); SIGTERM or SIGINT stop it after the current step with a checkpoint
of that step (txjax.preemption). Settings changed on resume are refused or applied from the resume step and
recorded (txjax.resume); a file of the workdir that cannot be written (no space, read-only, quota) ends the run in
one StorageError line, a checkpoint save at the step it was for (txjax.storage).
"""

from __future__ import annotations

import contextlib
import math
import sys
from pathlib import Path
from time import monotonic

import ml_collections

from txjax import budget, families, init_from, memory, preemption, resume, storage, workdir_lock
from txjax import config as config_lib
from txjax.checkpoint import Checkpointer
from txjax.data import prefetch
from txjax.distributed import InFlight, agree, barrier, is_lead, run_mesh
from txjax.evaluate import (
    eval_batches,
    evaluate,
    generation_metrics,
    make_eval_step,
    read_recorded,
    write_metrics,
)
from txjax.experiment import (
    CHECKPOINT_DIR,
    TrainedRun,
    build_dataset,
    build_model,
    build_tokenizer,
    fill_model_sizes,
)
from txjax.metrics_log import MetricsLog
from txjax.optim import eval_params
from txjax.peak import peak_gflops
from txjax.profiling import StepProfiler
from txjax.runs import common_step, layout
from txjax.summary import train_flops_per_batch


class Diverged(RuntimeError):
    """The loss or the parameters became NaN or infinite; the last checkpoint saved before that is kept."""


def train(config: ml_collections.ConfigDict, workdir: str | Path) -> dict:
    """Trains the run in `workdir`, resuming from its latest checkpoint; returns the final metrics."""
    (outcome,) = train_runs([config], [workdir])
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


def train_runs(configs: list[ml_collections.ConfigDict], workdirs: list[str | Path]) -> list[dict | Exception]:
    """Trains the runs together (one: as it is; more: stacked, see txjax.runs.group_key), resuming from the last step
    all of them saved; per run, the final metrics or the Diverged error that stopped it."""
    workdirs = [Path(w) for w in workdirs]
    with contextlib.ExitStack() as held:  # one writer per workdir; SIGTERM/SIGINT stop with a checkpoint
        for workdir in workdirs:
            held.enter_context(workdir_lock.hold(workdir))
        held.enter_context(preemption.watch())
        held.enter_context(storage.writing("the workdir", "free space or make it writable, then rerun to resume"))
        prepared = [prepare(c, w) for c, w in zip(configs, workdirs)]  # each folder gets its tokenizer
        tokenizer, train_data, valid_data = prepared[0]  # stacked runs share their data
        ckpts = [Checkpointer(w / CHECKPOINT_DIR, c.train.keep_checkpoints) for c, w in zip(configs, workdirs)]
        try:
            start = common_step(ckpts)
            changes = [save_config(c, w, ckpt, start) for c, w, ckpt in zip(configs, workdirs, ckpts)]
            return _loop(configs, workdirs, tokenizer, train_data, valid_data, ckpts, start, changes)
        finally:
            for ckpt in ckpts:
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


def save_config(config: ml_collections.ConfigDict, workdir: Path, ckpt: Checkpointer, start: int) -> dict:
    """Writes the resolved config into `workdir`, after checking that a run resuming from `ckpt` at `start` changes
    no setting it may not (txjax.resume); the changes it applies from there, recorded in config.json's history."""
    changes = {}
    if ckpt.latest_step() is not None:
        changes = resume.check(config_lib.load(workdir), config, workdir)
    if is_lead():
        resume.save(config, workdir, start, changes)
    return changes


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


def _loop(configs, workdirs, tokenizer, train_data, valid_data, ckpts, start, changes) -> list[dict | Exception]:
    config, t = configs[0], configs[0].train
    model, mesh = build_model(config), run_mesh(config.mesh)
    runs = layout(model, configs, mesh)
    state = runs.start(ckpts, start)
    if start:
        print(f"resuming {', '.join(map(str, workdirs))} from step {start}", flush=True)
    eval_step, exact_match = make_eval_step(model, mesh), config.data.kind == "synthetic"
    first = train_data.batch(t.seed, start, t.batch_size)
    flops = runs.size * train_flops_per_batch(model.cfg, config.family, first)
    b, s, l = families.batch_lengths(families.get(config.family), first)
    memory.check_train_step(model.cfg, config.family, b // t.grad_accum, s, l, mesh.devices.size)  # before compiling
    peak = peak_flops_per_s(config.model.dtype, mesh.devices.size)
    logs = [MetricsLog(w, t.steps, start, is_lead(), flops, peak, slots_per_step=b * (s + l)) for w in workdirs]
    for log, workdir, changed in zip(logs, workdirs, changes):
        if changed:
            log.changed(start, changed)
            print(f"{workdir}: from step {start}: {resume.describe(changed)}", file=sys.stderr, flush=True)
    batches = prefetch(runs.batch(train_data, k) for k in range(start, t.steps))
    plan = budget.BudgetPlan(t, budget.read(state), start) if t.decay_start == "budget" else None  # ends the run
    budget_s = 60.0 * t.max_minutes if t.max_minutes > 0 and plan is None else math.inf
    every_s = 60.0 * t.eval_every_minutes if t.eval_every_minutes > 0 else math.inf
    began, paused, next_eval_s = monotonic(), 0.0, every_s  # paused: seconds of evals and saves
    saved = {r: start or None for r in range(runs.size)}  # each run's last finished checkpoint
    failed: dict[int, Diverged] = {}
    live = lambda: [r for r in range(runs.size) if r not in failed]

    def valid_metrics(r: int, batches_to_read: int) -> dict:
        """Run r's loss metrics over the valid split (or its first batches) and, with eval_generation, greedy
        BLEU/chrF or exact match of the whole split; the minutes trained so far (evals and saves not counted)."""
        trained_minutes = (monotonic() - began - paused) / 60.0
        params = eval_params(t, runs.of(state, r))
        batches = preemption.interruptible(eval_batches(valid_data, t.batch_size, batches_to_read, mesh))
        metrics = evaluate(eval_step, params, batches, exact_match)
        if t.eval_generation:
            generated = generation_metrics(
                TrainedRun(configs[r], model, tokenizer, params, step), valid_data, method="greedy"
            )
            # the numbers (TensorBoard's scalars), not sacreBLEU's signatures or the strategy (greedy, said above)
            metrics |= {k: v for k, v in generated.items() if isinstance(v, int | float)}
        return metrics | {"train_minutes": trained_minutes}

    step, pending, records, in_flight, trained_s = start, [], {}, InFlight(), 0.0
    for r in range(runs.size):
        if preemption.owed_eval(workdirs[r], start, t):  # a signal cut it short: it comes before the steps after it
            logs[r].write(start, "valid", valid_metrics(r, t.eval_batches))
    profiler = StepProfiler(t.profile_steps, workdirs[0])
    try:
        for step, batch in zip(range(start + 1, t.steps + 1), batches):  # step: optimizer steps done after it
            profiler.before(step)
            state, metrics = runs.train_step(state, batch)
            profiler.after(step, metrics)
            pending.append(in_flight.add(metrics))
            trained_s = monotonic() - began - paused
            sync = step % t.log_every == 0  # the steps at which several processes combine their decisions
            if plan and plan.update(step, trained_s, sync):
                state = budget.record(state, plan, trained_s)
                print(f"time budget: the decay starts after step {step}, {plan.decay_steps} steps", flush=True)
            stop = preemption.stop_at(step, sync)  # a signal: save this step, then stop
            spent, timed_eval = agree([trained_s > budget_s, trained_s >= next_eval_s], sync)
            last = stop or step >= (plan.end if plan else t.steps) or spent
            save = last or step % t.checkpoint_every == 0
            if timed_eval:  # the next multiple of every_s after now
                next_eval_s = every_s * (trained_s // every_s + 1)
            eval_now = not last and (timed_eval or (t.eval_every > 0 and step % t.eval_every == 0))
            if save or eval_now or step % t.log_every == 0:
                for r in live():
                    records[r] = logs[r].train(step, [runs.of(m, r) for m in pending])
                    if records[r]["finite"] < 1:
                        logs[r].close()
                        failed[r] = _diverged(step, records[r], saved[r], ckpts[r])
                pending = []
            if not live():
                break
            paused_from = monotonic()
            if eval_now:
                for r in live():
                    logs[r].write(step, "valid", valid_metrics(r, t.eval_batches))
            if save:
                state = budget.record(state, plan, trained_s) if plan else state  # the clock, with the checkpoint
                for r in live():
                    ckpts[r].save(step, runs.of(state, r))
                    saved[r] = step
            if eval_now or save:
                paused += monotonic() - paused_from
                for r in live():
                    logs[r].restart_clock()
            if last:
                break
        preemption.raise_if_stopped()
    except preemption.Preempted:  # saved unless a signal cut an eval short; train_runs waits for it on the way out
        state = budget.record(state, plan, trained_s) if plan else state
        for r in live():
            if saved[r] != step:
                ckpts[r].save(step, runs.of(state, r))
            logs[r].close()
        raise
    finally:
        batches.close()
        profiler.close()
    results = dict(failed)
    for r in live():
        final = recorded_eval(workdirs[r], step) if step == start else None  # a finished run's rerun: as recorded
        if final is None:
            final = valid_metrics(r, 0)
            logs[r].write(step, "valid", final)
            if is_lead():
                write_metrics(workdirs[r], "valid", {"split": "valid", "step": step, **final})
        logs[r].close()
        results[r] = {
            "step": step,
            **({"train_loss": records[r]["loss"]} if r in records else {}),
            **{f"valid_{k}": v for k, v in final.items() if k != "train_minutes"},
            "wall_minutes": (monotonic() - began) / 60.0,
            "train_minutes": final["train_minutes"],
            "ms_per_step_median": logs[r].median_ms_per_step(),
            "runs_vmapped": runs.size,
            "train_step_compiles": runs.compiles(),
            "eval_step_compiles": eval_step._cache_size(),
        }
    return [results[r] for r in range(runs.size)]


def recorded_eval(workdir: Path, step: int) -> dict | None:
    """The final eval eval_valid.json records for `step` (its metrics only), if it records that step: a rerun that
    trains no step returns it, and never rewrites it (nor appends to metrics.jsonl) with a figure of no training."""
    recorded = read_recorded(workdir, "valid")
    if recorded.get("step") != step:
        return None
    return {k: v for k, v in recorded.items() if k not in ("split", "step", "machine")}


def _diverged(step: int, record: dict, saved: int | None, ckpt: Checkpointer) -> Diverged:
    kept = (
        f"and the last good checkpoint (step {saved}) is kept in {ckpt.directory}"
        if saved
        else "before any checkpoint was saved"
    )
    return Diverged(
        f"the loss or the parameters became NaN/inf by step {step} (recent mean loss {record['loss']}); training "
        f"stopped {kept}. Lower --config.train.learning_rate or set --config.train.grad_clip"
    )
