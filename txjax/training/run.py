"""One run as the training loop (txjax.training.loop) drives it, from its settings resolved against its workdir
(txjax.training.edge.RunSpec): its resolved config and resume check, checkpoints, logs and evaluations, and,
trained alone, its program: the state laid out on a mesh by its logical axes and the jitted train step, each
process building its rows of every batch. txjax.training.stack drives R of them with one vmapped program instead.

A run whose loss or parameters become non-finite stops with Diverged, the last checkpoint before that kept. A run
that finishes keeps its result (what run.py train prints and the trackers get as result.json) in
train_result.json, so that a rerun of the finished run, which trains no step, prints and logs the run's figures
again (its last train loss, its step times, its compile counts), not those of a process that trained nothing.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import flax.linen as nn
import jax
from jax.sharding import Mesh

from txjax import config as config_lib
from txjax import families
from txjax.evaluate.split import read_recorded, write_metrics
from txjax.experiment import CHECKPOINT_DIR
from txjax.ops import memory, preemption, storage
from txjax.ops.metrics_log import MetricsLog, read_metrics
from txjax.ops.peak import peak_gflops
from txjax.ops.summary import train_flops_per_batch
from txjax.ops.trackers import Trackers
from txjax.parallel.distributed import is_lead, run_mesh
from txjax.parallel.sharding import SEQUENCE_AXIS, global_batch, process_rows
from txjax.state.checkpoint import Checkpointer
from txjax.state.train_state import init_state, optimizer, state_shardings, with_hyperparams
from txjax.training import init_from, resume
from txjax.training.edge import RunSpec
from txjax.training.step import make_train_step

TRAIN_RESULT_FILE = "train_result.json"


class Diverged(RuntimeError):
    """The loss or the parameters became NaN or infinite; the last checkpoint saved before that is kept."""


class Run:
    """One run: built from its RunSpec, then opened step by step by the loop, which reads its typed values
    (t: TrainConfig; the model, its ModelConfig frozen)."""

    size = 1

    def __init__(self, spec: RunSpec):
        self.spec, self.workdir, self.t, self.exact_match = spec, spec.workdir, spec.train, spec.exact_match
        self.ckpt: Checkpointer | None = None
        self.log: MetricsLog | None = None
        self.saved: int | None = None  # the last finished checkpoint
        self.record: dict | None = None  # the last logged train record
        self.diverged: Diverged | None = None

    @property
    def name(self) -> str:
        return str(self.workdir)

    def build(self) -> tuple[nn.Module, Mesh]:
        """The run's model (its family's, of its ModelConfig) and its mesh."""
        return families.build(self.spec.family, self.spec.model), run_mesh(self.spec.mesh)

    def open_checkpoints(self) -> list[Checkpointer]:
        self.ckpt = Checkpointer(self.workdir / CHECKPOINT_DIR, self.t.keep_checkpoints)
        return [self.ckpt]

    def resolve(self, start: int) -> dict:
        """Writes the resolved config into the workdir, after checking that a run resuming from its checkpoints at
        `start` changes no setting it may not (txjax.training.resume); the changes it applies from there, recorded
        in config.json's history."""
        self.saved = start or None
        changes = {}
        if self.ckpt.latest_step() is not None:
            changes = resume.resumed_changes(self.spec.config, self.workdir, start)
        if is_lead():
            resume.record_changes(self.spec.config, self.workdir, start, changes)
        return changes

    def compile(self, model, mesh: Mesh) -> None:
        """The program of a run trained alone, on `mesh`."""
        tx, seed, lora = optimizer(model, self.t.optim, self.t.lora), self.t.seed, self.t.lora
        self.mesh, self.rows = mesh, process_rows(mesh, self.t.batch_size)
        shardings = state_shardings(model, tx, seed, mesh, lora)
        self.init = jax.jit(lambda: init_state(model, tx, seed, lora_config=lora), out_shardings=shardings)

        def first():
            """Fresh moments over another workdir's parameters (train.init_from: fine-tuning), or over this workdir's
            own when it holds parameters alone at step 0 (imported); asked when the run starts, its checkpoints open."""
            source = self.t.init_from or (self.workdir if self.ckpt.latest_step() == 0 else None)
            return init_from.initial_state(source, tx, mesh, shardings, model, seed, lora) if source else self.init()

        self.first = first
        self.train_step = make_train_step(model, tx, self.t, mesh)

    def start(self, step: int):
        """The state at `step`: at 0 drawn afresh (or train.init_from's), else restored (onto this mesh, whatever
        mesh wrote it) with the optimizer's hyperparameters of this config (applied from the resume step)."""
        if step == 0:
            return self.first()
        return self.restored(jax.eval_shape(self.init), step)

    def restored(self, abstract, step: int):
        """The state saved at `step`, with this config's optimizer hyperparameters."""
        return with_hyperparams(self.ckpt.restore(abstract, step), self.t.optim.hyperparams())

    def batch(self, data, k: int):
        return global_batch(data.batch(self.t.seed, k, self.t.batch_size, self.rows), self.mesh)

    def compiles(self) -> int:
        """How often the train step was compiled (1 unless a shape changed)."""
        return self.train_step._cache_size()

    def measure(self, model, first, mesh: Mesh) -> tuple[float, float | None, int]:
        """(model FLOPs, the devices' peak FLOP/s, input slots) of one step like the batch `first`, after checking
        that the step fits the devices' memory (before anything compiles)."""
        family = families.family_of(model)
        flops = train_flops_per_batch(model.cfg, family.name, first)
        b, s, l = families.batch_lengths(family, first)
        rows = b // self.t.grad_accum
        memory.check_train_step(model.cfg, family.name, rows, s, l, mesh.devices.size, mesh.shape[SEQUENCE_AXIS])
        return flops, peak_flops_per_s(model.cfg.dtype, mesh.devices.size), b * (s + l)

    def open_log(self, start: int, changes: dict, flops: float, peak: float | None, slots: int) -> None:
        """The run's MetricsLog from `start` (flops and slots: of a step, peak: the devices' FLOP/s), with the
        settings a resume changed recorded."""
        trackers = Trackers(self.workdir, self.t.trackers, self.spec.config) if is_lead() else None
        self.log = MetricsLog(
            self.workdir, self.t.steps, start, is_lead(), flops, peak, slots_per_step=slots, trackers=trackers
        )
        if changes:
            self.log.changed(start, changes)
            print(f"{self.workdir}: from step {start}: {resume.describe(changes)}", file=sys.stderr, flush=True)

    def logged(self, step: int, pending: list[dict]) -> bool:
        """Logs the steps' metrics since the last log; False (the run stopped by Diverged) when they are not finite."""
        self.record = self.log.train(step, pending)
        if self.record["finite"] < 1:
            self.log.close("failed")
            self.diverged = diverged(step, self.record, self.saved, self.ckpt)
        return self.diverged is None

    def save(self, step: int, state) -> None:
        self.ckpt.save(step, state)
        self.saved = step

    def stop(self, step: int, state) -> None:
        """Stopped by a signal: the step saved (unless it was), the log closed."""
        if self.saved != step:
            self.save(step, state)
        self.log.close("stopped")

    def owed_eval(self, start: int, state, valid) -> None:
        """The periodic eval of the resumed step `start` when a signal cut it short (txjax.ops.preemption.owed_eval)."""
        if preemption.owed_eval(self.workdir, start, self.t.eval_every, self.t.steps):
            self.log.write(start, "valid", valid(self.spec.decode, state, self.t.eval_batches))

    def evaluate(self, step: int, state, valid) -> None:
        """A periodic eval: `valid` (the loop's) over the first train.eval_batches batches, into the logs."""
        self.log.write(step, "valid", valid(self.spec.decode, state, self.t.eval_batches))

    def restart_clock(self) -> None:
        self.log.restart_clock()

    def finish(self, step: int, state, start: int, valid, wall_minutes, program: dict) -> dict | Diverged:
        """The run's results after its last `step`: the last train loss, the final eval of the whole valid split
        (written into the logs), the minutes `wall_minutes()` and the `program`'s figures, kept in
        train_result.json; the Diverged error instead if that stopped it. A finished run's rerun, which trained no
        step, returns the result recorded (or, from a workdir without one, the final eval recorded)."""
        if self.diverged:
            return self.diverged
        if step == start and (result := recorded_result(self.workdir, step)) is not None:
            self.log.close("finished", result)  # the trackers get the run's own result, a caught-up one included
            return result
        final = recorded_eval(self.workdir, step) if step == start else None
        if final is None:
            final = valid(self.spec.decode, state, 0)
            self.log.write(step, "valid", final)
            if is_lead():
                write_metrics(self.workdir, "valid", {"split": "valid", "step": step, **final})
        result = {
            "step": step,
            **({"train_loss": self.record["loss"]} if self.record else {}),
            **{f"valid_{k}": v for k, v in final.items() if k != "train_minutes"},
            "wall_minutes": wall_minutes(),
            "train_minutes": final["train_minutes"],
            "ms_per_step_median": self.log.median_ms_per_step(),
            **program,
        }
        if is_lead():
            storage.replace_file(self.workdir / TRAIN_RESULT_FILE, json.dumps(result, indent=1) + "\n")
        self.log.close("finished", result)
        return result


def peak_flops_per_s(dtype: str, devices: int) -> float | None:
    """The MFU denominator: `devices` x the measured matmul ceiling of one device in the compute `dtype`
    (txjax.ops.peak.peak_gflops, FLOP/s); None, with a warning, when measuring it fails (the run then logs no mfu)."""
    try:
        return 1e9 * peak_gflops()[dtype] * devices
    except Exception as e:  # a diagnostic: never a reason to stop training
        print(
            f"warning: mfu not logged: measuring the matmul peak failed ({type(e).__name__}: {e})",
            file=sys.stderr,
            flush=True,
        )
        return None


def common_step(ckpts: list[Checkpointer]) -> int:
    """The last step every run has a finished, undamaged checkpoint of (0: start afresh); ConfigError when there are
    checkpoints and all are damaged (txjax.state.checkpoint: each damaged step gets one warning line)."""
    steps = sorted(set.intersection(*(set(c.manager.all_steps()) for c in ckpts)), reverse=True)
    whole = next((s for s in steps if all([c.verified(s) for c in ckpts])), None)
    if steps and whole is None:
        raise config_lib.ConfigError(
            f"no checkpoint of step {', '.join(map(str, steps))} in {', '.join(str(c.directory) for c in ckpts)} is "
            "whole (see the warnings); move the checkpoints folder away to start the run afresh"
        )
    return whole or 0


def recorded_result(workdir: Path, step: int) -> dict | None:
    """The result train_result.json records, if it is that of `step` (a run stopped by a signal at its last step
    recorded none)."""
    path = workdir / TRAIN_RESULT_FILE
    result = json.loads(path.read_text()) if path.is_file() else {}
    return result if result.get("step") == step else None


def recorded_eval(workdir: Path, step: int) -> dict | None:
    """The final eval eval_valid.json records for `step` (its metrics only), if it records that step: a rerun that
    trains no step returns it, and never rewrites it (nor appends to metrics.jsonl) with a figure of no training."""
    recorded = read_recorded(workdir, "valid")
    if recorded.get("step") != step:
        return None
    if "train_minutes" not in recorded:  # `run.py eval` rewrote eval_valid.json: the training's own final record
        finals = [r for r in read_metrics(workdir) if r["split"] == "valid" and r["step"] == step]
        recorded["train_minutes"] = finals[-1].get("train_minutes") if finals else None
    return {k: v for k, v in recorded.items() if k not in ("split", "step", "machine")}


def diverged(step: int, record: dict, saved: int | None, ckpt: Checkpointer) -> Diverged:
    kept = (
        f"and the last good checkpoint (step {saved}) is kept in {ckpt.directory}"
        if saved
        else "before any checkpoint was saved"
    )
    return Diverged(
        f"the loss or the parameters became NaN/inf by step {step} (recent mean loss {record['loss']}); training "
        f"stopped {kept}. Lower --config.train.learning_rate or set --config.train.grad_clip"
    )
