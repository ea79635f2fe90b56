"""Training: the one loop around the jitted train step (resume, checkpoints, evals, logs, time budget) for one run
(txjax.training.run.Run); R runs stacked under jax.vmap (txjax.training.stack) are driven by the same loop, so
every feature of the loop reaches sweeps as it reaches single runs.

Batch k is a pure function of (seed, k), step s draws its dropout masks from fold_in(dropout key, s) and
checkpoints hold the whole state, so a resumed run takes the same steps as one that never stopped (bit for bit on
CPU). The loop reads values back from the device only every log_every steps and before a save or an eval, and runs
at most 8 steps ahead of the device (distributed.InFlight: more deadlock XLA:CPU meshes). Each logged interval
records ms_per_step, target_tokens_per_s (tokens predicted with weight > 0), slots_per_s (every input position,
padding included) and
    mfu = model FLOPs per step / seconds per step / (devices x peak FLOP/s of one device in model.dtype)
with the FLOPs from the batch shape (summary.train_flops_per_batch; R stacked runs: R times one run's, since they
share the device) and the peak measured once per device kind (txjax.ops.peak.peak_gflops, cached).
train.decay_start="budget" sizes the WSD decay by the time budget and ends the run where it ends
(txjax.training.budget). A run whose loss or parameters become non-finite stops (Diverged); in a stacked group the
others go on. A run holds its workdir's writer lock (txjax.ops.workdir_lock); SIGTERM or SIGINT stop it after the
current step with a checkpoint of that step (txjax.ops.preemption). Settings changed on resume are refused or applied
from the resume step and recorded (txjax.training.resume); a file of the workdir that cannot be written (no space,
read-only, quota) ends the run in one StorageError line, a checkpoint save at the step it was for (txjax.ops.storage).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from pathlib import Path
from time import monotonic

import ml_collections

from txjax.data import prefetch
from txjax.errors import ConfigError
from txjax.evaluate.split import eval_batches, evaluate, generation_metrics, make_eval_step
from txjax.ops import preemption, storage, workdir_lock
from txjax.ops.profiling import StepProfiler
from txjax.parallel.distributed import InFlight, agree, is_lead
from txjax.state.optim import eval_params
from txjax.training import budget, edge
from txjax.training.run import Run, common_step
from txjax.training.trainee import Trainee


def train(config: ml_collections.ConfigDict, workdir: str | Path) -> dict:
    """Trains the run in `workdir` (its config validated: txjax.config.validate), resuming from its latest
    checkpoint; returns the final metrics, or raises the Diverged error that stopped it."""
    outcome = drive([config], [workdir], lambda runs: runs[0])
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


def drive(
    configs: list[ml_collections.ConfigDict], workdirs: list[str | Path], together: Callable[[list[Run]], Trainee]
):
    """Trains the runs of `configs` in `workdirs`, resuming from the last step they saved: each config resolved
    against its workdir at the edge (txjax.training.edge.prepare_run), under the workdir's lock, into a Run, and
    `together(runs)` the Trainee the loop drives (txjax.training.trainee: a Run, or stacked runs,
    txjax.training.stack.StackedRuns); its outcome (Run.finish)."""
    created = [Path(workdir) for workdir in workdirs if not Path(workdir).exists()]
    with contextlib.ExitStack() as held:  # one writer per workdir; SIGTERM/SIGINT stop with a checkpoint
        for workdir in workdirs:
            held.enter_context(workdir_lock.hold(Path(workdir)))
        held.enter_context(preemption.watch())
        held.enter_context(storage.writing("the workdir", "free space or make it writable, then rerun to resume"))
        try:
            prepared = [edge.prepare_run(config, Path(workdir)) for config, workdir in zip(configs, workdirs)]
        except ConfigError:  # refused before training (a split without its file): no half-made workdir is left
            for workdir in created if is_lead() else ():
                workdir_lock.clear(workdir)
            raise
        run, data = together([Run(spec) for spec, _ in prepared]), prepared[0][1]  # stacked runs share data
        ckpts = run.open_checkpoints()
        try:
            start = common_step(ckpts)
            return _loop(run, data, start, run.resolve(start))
        finally:
            for ckpt in ckpts:
                ckpt.close()


def _loop(run: Trainee, data, start: int, changes):
    tokenizer, train_data, valid_data = data
    t, (model, mesh) = run.t, run.build()
    run.compile(model, mesh)
    state = run.start(start)
    if start:
        print(f"resuming {run.name} from step {start}", flush=True)
    eval_step = make_eval_step(model, mesh)
    first = train_data.batch(t.seed, start, t.batch_size)
    run.open_log(start, changes, *run.measure(model, first, mesh))
    batches = prefetch(run.batch(train_data, k) for k in range(start, t.steps))
    plan = budget.BudgetPlan(t, budget.read(state), start) if t.budget_decay else None  # ends the run
    budget_s = 60.0 * t.max_minutes if t.max_minutes > 0 and plan is None else math.inf
    every_s = 60.0 * t.eval_every_minutes if t.eval_every_minutes > 0 else math.inf
    began, paused, next_eval_s = monotonic(), 0.0, every_s  # paused: seconds of evals and saves

    def valid(decoding, run_state, batches_to_read: int) -> dict:
        """A run's loss metrics over the valid split (or its first batches) at `run_state` and, with
        eval_generation, greedy BLEU/chrF or exact match of the whole split (`decoding`: the run's decode settings);
        the minutes trained so far (evals and saves not counted)."""
        trained_minutes = (monotonic() - began - paused) / 60.0
        params = eval_params(t.optim.optimizer, run_state)
        batches = preemption.interruptible(eval_batches(valid_data, t.batch_size, batches_to_read, mesh))
        metrics = evaluate(eval_step, params, batches, run.exact_match)
        if t.eval_generation:
            generated = generation_metrics(model, params, tokenizer, valid_data, decoding, method="greedy")
            # the numbers (TensorBoard's scalars), not sacreBLEU's signatures or the strategy (greedy, said above)
            metrics |= {k: v for k, v in generated.items() if isinstance(v, int | float)}
        return metrics | {"train_minutes": trained_minutes}

    step, pending, in_flight, trained_s = start, [], InFlight(), 0.0
    run.owed_eval(start, state, valid)  # a signal cut it short: it comes before the steps after it
    profiler = StepProfiler(t.profile_steps, run.workdir)
    try:
        for step, batch in zip(range(start + 1, t.steps + 1), batches):  # step: optimizer steps done after it
            profiler.before(step)
            state, metrics = run.train_step(state, batch)
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
                going, pending = run.logged(step, pending), []
                if not going:  # diverged
                    break
            paused_from = monotonic()
            if eval_now:
                run.evaluate(step, state, valid)
            if save:
                state = budget.record(state, plan, trained_s) if plan else state  # the clock, with the checkpoint
                run.save(step, state)
            if eval_now or save:
                paused += monotonic() - paused_from
                run.restart_clock()
            if last:
                break
        preemption.raise_if_stopped()
    except preemption.Preempted:  # saved unless a signal cut an eval short; drive waits for it on the way out
        run.stop(step, budget.record(state, plan, trained_s) if plan else state)
        raise
    finally:
        batches.close()
        profiler.close()
    program = {"runs_vmapped": run.size, "train_step_compiles": run.compiles()}
    program["eval_step_compiles"] = eval_step._cache_size()
    return run.finish(step, state, start, valid, lambda: (monotonic() - began) / 60.0, program)
