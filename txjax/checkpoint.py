"""Checkpoints with orbax: save a pytree every N steps and at the end, keep the last K, restore the latest.

Saves are asynchronous: `save` returns once the arrays are copied to host memory (so the caller may donate them
to the next step) and the files are written in the background; `close` waits for them. A process killed during a
save leaves a `STEP.orbax-checkpoint-tmp` folder that orbax ignores on restore and removes on the next save.
"""

from __future__ import annotations

from pathlib import Path

import orbax.checkpoint as ocp


class Checkpointer:
    """The `checkpoints/` folder of a workdir: one subfolder per saved step."""

    def __init__(self, directory: str | Path, keep: int):
        self.directory = Path(directory).absolute()
        self.manager = ocp.CheckpointManager(
            self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
        )

    def latest_step(self) -> int | None:
        """The last step whose save finished (None when there is none)."""
        return self.manager.latest_step()

    def save(self, step: int, state) -> None:
        self.manager.save(step, args=ocp.args.StandardSave(state), force=True)

    def restore(self, abstract_state, step: int | None = None):
        """The state saved at `step` (default: the latest), with the structure, shapes and dtypes of
        `abstract_state` (a pytree of jax.ShapeDtypeStruct, e.g. from jax.eval_shape of the init)."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no finished checkpoint in {self.directory}")
        return self.manager.restore(step, args=ocp.args.StandardRestore(abstract_state))

    def close(self) -> None:
        """Waits for the pending saves to be on disk."""
        self.manager.wait_until_finished()
        self.manager.close()
