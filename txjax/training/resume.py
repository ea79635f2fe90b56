"""What a resumed run may change: every field of the config that differs from the saved run's is either refused or
applied, never silently ignored.

    refused   the family, every model field but the few whose schema lets a resume change them (the state's
              shapes stay: dtype, dropout, remat, ...), and the fields marked resume=False (what batch k is, what
              the optimizer state holds, the tokenizer's data): txjax.sections.schema.resume_refused. One
              ConfigError line naming each, raised before config.json is overwritten. A field the saved run did
              not read (txjax.unread; a config saved before those were refused may hold one) is applied instead
    applied   every other field, from the resume step: the optimizer's injected hyperparameters (optim.HYPERPARAMS)
              are written into the restored state (txjax.training.run.Run.restored), the schedule's static fields
              (steps, schedule, decay_fraction, grad_clip) and the objective's compile into the new train step, the
              evaluation, logging and mesh settings are read by the loop. Each resume that changes any is recorded
              as {"step": s, "changes": {field: [old, new]}} in config.json's "history" and as a line
              {"step": s, "split": "config", "changes": ...} in metrics.jsonl.

A workdir's tokenizer, built before the first checkpoint, is checked against the config as checkpoints are
(txjax.experiment.build_tokenizer).
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_collections

from txjax import config as config_lib
from txjax import unread
from txjax.sections.schema import resume_refused


def differences(saved: ml_collections.ConfigDict, config: str) -> dict[str, list]:
    """{"section.field": [saved value, new value]} for every field whose value differs from the config's (its
    JSON)."""

    def flat(tree: dict, prefix: str = "") -> dict:
        out = {}
        for key, value in tree.items():
            out |= flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value}
        return out

    old, new = flat(json.loads(saved.to_json())), flat(json.loads(config))  # in the config's order, model first
    return {name: [old.get(name), value] for name, value in new.items() if old.get(name) != value}


def resumed_changes(config: str, workdir: Path, start: int = 0) -> dict[str, list]:
    """The changes a run of the config (its JSON) resuming from `workdir`'s checkpoints at step `start` applies to
    the one saved there ({field: [old, new]}); a ConfigError naming the refused ones when there are any, or when
    the config's train.steps ends before `start` (the run would record settings it never trains with)."""
    saved = config_lib.load(workdir)
    steps = json.loads(config)["train"]["steps"]
    if steps < start:
        raise config_lib.ConfigError(
            f"config.train.steps={steps} is below step {start} of {workdir}'s latest checkpoint: give train.steps >= "
            f"{start} to train on, or evaluate it as it is (run.py eval --workdir={workdir})"
        )
    changes, ignored = differences(saved, config), unread.unread_fields(saved)  # changing one changes nothing
    bad = [
        f"{name} {old!r} -> {new!r}"
        for name, (old, new) in changes.items()
        if resume_refused(name) and name not in ignored
    ]
    if bad:
        raise config_lib.ConfigError(
            f"{workdir} holds checkpoints of another run ({'; '.join(bad)}): pass a new --workdir, or the "
            f"settings it was trained with (no --config resumes with {Path(workdir) / config_lib.CONFIG_FILE})"
        )
    return changes


def record_changes(config: str, workdir: Path, start: int, changes: dict[str, list]) -> None:
    """Writes config.json of the config (its JSON), its history extended by the changes applied from step `start`
    (when there are any)."""
    entry = [{"step": start, "changes": changes}] if changes else []
    config_lib.write(config, workdir, config_lib.history(workdir) + entry)


def describe(changes: dict[str, list]) -> str:
    return "; ".join(f"{name} {old!r} -> {new!r}" for name, (old, new) in changes.items())
