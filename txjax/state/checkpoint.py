"""Checkpoints with orbax: save a pytree every N steps and at the end, keep the last K, restore the newest whole one.

`save` returns once the step is on disk (orbax writes it from background threads; the training loop must know before it
takes another step): a save that fails for want of space, a read-only filesystem or a quota is one StorageError line
naming the folder and the last good checkpoint (txjax.ops.storage), nothing trained after it, and nothing else: its
other writes still in flight end after orbax closed the save's event loop, and what they report then (bare
tracebacks, "Event loop is closed") is dropped (storage.drop_stray_write_reports). A process killed during a
save leaves a `STEP.orbax-checkpoint-tmp` folder that orbax ignores on restore and removes on the next save.

Damage: orbax 0.12.8 stores no checksum of the array data (a byte flipped in
`STEP/default/ocdbt.process_0/d/*` restores silently as a different value), so every save also writes
`STEP/sha256sums.txt` (`sha256sum -c` format) over the files of the step's items, from orbax's post-finalization
hook: in the step's temporary folder, after every process finished writing, before the step is committed, so a
committed step always has it. `verified(step)` checks a step against it (the training loop resumes from the newest
step every run has whole: txjax.training.run.common_step); `restore` of the latest step falls back from a step that
fails the check or does not restore to the newest one that does (a reader: eval, generate); a step saved without
checksums, by an older txjax, is restored unverified. Each bad step gets one warning line; when none is left, a
ConfigError. A later save of a step set aside that way first renames its folder to `STEP.damaged` (orbax ignores
that name), so the bytes are kept for a look.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from pathlib import Path

import orbax.checkpoint as ocp

from txjax.errors import ConfigError
from txjax.ops import storage
from txjax.parallel.distributed import barrier, is_lead

CHECKSUM_FILE = "sha256sums.txt"
_TMP_SUFFIX = ".orbax-checkpoint-tmp"


class Damaged(Exception):
    """A step whose files do not match its checksums."""


class Checkpointer:
    """The `checkpoints/` folder of a workdir: one subfolder per saved step."""

    def __init__(self, directory: str | Path, keep: int):
        self.directory = Path(directory).absolute()
        self._saving = None  # the step whose save is in flight (orbax runs one at a time)
        self._failed = False  # a save failed (and said so): closing does not raise it again
        storage.drop_stray_write_reports()  # a failed save's stray writes: its one line, not their tracebacks
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=keep,
                create=True,
                async_options=ocp.AsyncOptions(post_finalization_callback=self._write_checksums),
            ),
        )

    def latest_step(self) -> int | None:
        """The last step whose save finished (None when there is none)."""
        return self.manager.latest_step()

    def save(self, step: int, state, advice: str | None = None) -> None:
        """Saves `state` as `step` and waits until it is on disk; StorageError (ending with `advice`, by default
        training's) when it cannot be written."""
        last = self.latest_step()
        kept = f"the last good checkpoint is step {last}" if last is not None else "no checkpoint was saved before"
        advice = (
            advice
            or f"training stopped at step {step} and {kept}: free space or make it writable, then rerun to resume"
        )
        with storage.quiet_orbax(), storage.writing(f"checkpoint step {step} in {self.directory}", advice):
            try:
                if step in self.manager.all_steps():  # a damaged step the run fell back from: set it aside
                    if is_lead():
                        damaged = self.directory / f"{step}.damaged"
                        folder = damaged if not damaged.exists() else f"{damaged}.{time.time()}"
                        (self.directory / str(step)).rename(folder)
                    barrier(f"set aside step {step}")
                    self.manager.reload()
                self._saving = step  # the hook below names the one step in flight
                self.manager.save(step, args=ocp.args.StandardSave(state), force=True)
                self.manager.wait_until_finished()
            except Exception:
                self._failed = True
                raise

    def restore(self, abstract_state, step: int | None = None):
        """The state saved at `step` (default: the latest that restores), with the structure, shapes and dtypes of
        `abstract_state` (a pytree of jax.ShapeDtypeStruct, e.g. from jax.eval_shape of the init)."""
        return next(self.restore_newest(abstract_state, 1, step))[1]

    def restore_newest(self, abstract_state, count: int, step: int | None = None, only: tuple[str, ...] = ()):
        """Yields (step, state) for the `count` newest steps that restore, newest first, one state at a time (a
        caller that reduces them holds one): from the latest step, or from `step` and the steps before it (`step`
        alone when count is 1). A step that does not restore is passed over with a warning line; fewer than
        `count` left is a ConfigError naming the steps there are. `only`: the state's fields to read (e.g. step and
        params: orbax's partial restore, nothing else of the step is read or allocated), the others None."""
        args, read = ocp.args.StandardRestore(abstract_state), lambda restored: restored
        if only:  # a dataclass state (TrainState): the fields named, the others None
            item = {name: getattr(abstract_state, name) for name in only}
            restore_args = ocp.checkpoint_utils.construct_restore_args(item)
            args = ocp.args.PyTreeRestore(item=item, restore_args=restore_args, partial_restore=True)
            names = [f.name for f in dataclasses.fields(abstract_state)]
            read = lambda restored: abstract_state.replace(**{name: restored.get(name) for name in names})
        steps = sorted(self.manager.all_steps(), reverse=True)
        if step is not None:
            steps = [step] + ([s for s in steps if s < step] if count > 1 else [])
        if not steps:
            raise FileNotFoundError(f"no finished checkpoint in {self.directory}")
        restored, problems = [], []
        for i, s in enumerate(steps):
            try:
                verify(self.directory / str(s))
                state = read(self.manager.restore(s, args=args))
            except Exception as e:  # noqa: BLE001 -- any failure to read a step is a reason to try the one before
                problems.append(f"step {s} ({type(e).__name__}: {_first_line(e)})")
                later = f"; trying step {steps[i + 1]}" if i + 1 < len(steps) else ""
                print(
                    f"warning: checkpoint {problems[-1]} in {self.directory} does not restore{later}", file=sys.stderr
                )
                continue
            restored.append(s)
            yield s, state
            if len(restored) == count:
                return
        if not restored:
            raise ConfigError(
                f"no checkpoint in {self.directory} restores ({'; '.join(problems)}); move the folder away to start "
                "the run afresh"
            )
        raise ConfigError(
            f"{count} checkpoints asked for, {len(restored)} restore in {self.directory} (steps "
            f"{', '.join(map(str, restored))}): ask for at most {len(restored)}, or train with a larger "
            "train.keep_checkpoints"
        )

    def verified(self, step: int) -> bool:
        """Whether the step's files match their checksums (see `verify`); a warning line names a step that does not."""
        try:
            verify(self.directory / str(step))
            return True
        except Damaged as e:
            print(
                f"warning: checkpoint step {step} in {self.directory} is damaged ({e}); passing it over",
                file=sys.stderr,
            )
            return False

    def close(self) -> None:
        """Lets orbax's threads go (after a failed save, without raising its error again)."""
        with storage.quiet_orbax(), contextlib.suppress(Exception) if self._failed else contextlib.nullcontext():
            self.manager.close()

    def _write_checksums(self) -> None:
        (folder,) = self.directory.glob(f"{self._saving}{_TMP_SUFFIX}*")
        files = sorted(p for p in folder.glob("*/**/*") if p.is_file())
        lines = [f"{storage.sha256(p)}  {p.relative_to(folder)}\n" for p in files]
        (folder / CHECKSUM_FILE).write_text("".join(lines))


def verify(step_folder: Path) -> None:
    """Raises Damaged when a file listed in the step's checksum file is missing or differs."""
    listing = step_folder / CHECKSUM_FILE
    if not listing.is_file():
        return
    for line in listing.read_text().splitlines():
        digest, _, name = line.partition("  ")
        path = step_folder / name
        if not path.is_file() or storage.sha256(path) != digest:
            raise Damaged(f"{name} {'differs from its sha256' if path.is_file() else 'is missing'}")


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [""])[0][:200]
