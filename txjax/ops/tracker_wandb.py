"""Weights & Biases as a tracker (train.trackers=jsonl,...,wandb; the track extra): one W&B run per txjax run, its
id kept in WORKDIR/trackers.json so that a resumed run continues it (txjax.ops.trackers).

The environment chooses where it goes: WANDB_PROJECT (default "txjax"), WANDB_ENTITY, WANDB_API_KEY, WANDB_MODE
(offline: the run is written to WORKDIR/wandb/offline-run-*-ID and uploaded later by `wandb sync`; a resumed
offline run writes one more such folder with the same ID) and WANDB_DIR (default: the workdir). Metrics are named
"split/metric" (train/loss, valid/loss) at their step, as in TensorBoard. wandb.log only queues the record for W&B's
own process, which uploads it in the background, so training never waits on the network for it; the waits that can
block are bounded here unless the environment sets them: wandb.init waits at most WAITS["init_timeout"] seconds and
run.finish at most WAITS["finish_timeout"] (what is not uploaded by then stays on disk for `wandb sync`).
"""

from __future__ import annotations

import json
import os
import secrets
import sys
from pathlib import Path

from txjax.extras import require
from txjax.ops.provenance import machine

WAITS = {"init_timeout": 30.0, "finish_timeout": 60.0}  # seconds; WANDB_INIT_TIMEOUT / WANDB_FINISH_TIMEOUT win


class WandB:
    """A W&B run: the resolved config (and the run's sweep settings) as its config, the machine under "provenance"."""

    def __init__(self, workdir: Path, config: dict, member: dict | None, state: dict):
        wandb = require("wandb", "train.trackers=wandb")
        self.wandb, resumed = wandb, "id" in state
        bounded = {k: v for k, v in WAITS.items() if f"WANDB_{k.upper()}" not in os.environ}
        first = {**config, **({"sweep": member["settings"]} if member else {})}
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "txjax"),
            id=state.get("id") or secrets.token_hex(4),
            name=Path(workdir).resolve().name,
            resume="allow",
            reinit="create_new",  # stacked runs: several W&B runs live in one process
            group=(member or {}).get("group"),
            config=None if resumed else first,
            dir=os.environ.get("WANDB_DIR") or str(workdir),
            settings=wandb.Settings(console="off", **bounded),
        )
        self.run.config.update({"provenance": machine(" ".join(sys.argv))}, allow_val_change=True)

    def state(self) -> dict:
        return {"id": self.run.id}

    def log(self, step: int, split: str, record: dict) -> None:
        self.run.log({f"{split}/{k}": v for k, v in record.items()}, step=step)

    def changed(self, step: int, changes: dict) -> None:
        self.run.config.update({f"resumed_at_step_{step}": changes}, allow_val_change=True)

    def end(self, status: str, artifacts: list[Path], result: dict | None) -> None:
        """result.json and the workdir's artifacts as one W&B artifact of type "run-outputs"; a stopped run
        (preempted) is marked preempting, a failed one ends with exit code 1."""
        outputs = self.wandb.Artifact(f"run-{self.run.id}-outputs", type="run-outputs")
        for path in artifacts:
            outputs.add_file(str(path), name=path.name)
        if result is not None:
            with outputs.new_file("result.json") as f:
                f.write(json.dumps(result, indent=1) + "\n")
        if artifacts or result is not None:
            self.run.log_artifact(outputs)
        if status == "stopped":
            self.run.mark_preempting()
        self.run.finish(exit_code=1 if status == "failed" else 0)
