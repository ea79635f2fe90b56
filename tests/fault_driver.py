"""A signal sent at an exact point of a run, for tests/test_faults.py: `inject` in this process, or a `run.py`
subprocess that sends it to itself (SIGKILL cannot be tried in-process):

    python tests/fault_driver.py SIGNAL WHERE N [run.py arguments ...]

SIGNAL is KILL, TERM or INT; WHERE is
    batch  when the training loop asks for its N-th batch (after N - 1 steps: the signal lands in step N)
    eval   when an evaluation asks for its N-th batch (counted over all of the process's evaluations)
    save   inside the N-th checkpoint save, after orbax wrote the files, just before it commits the step (renames
           its STEP.orbax-checkpoint-tmp folder; orbax 0.12.8's async_checkpointer._on_commit_callback)
Counts start afresh in every process and every `inject`.
"""

import contextlib
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orbax.checkpoint._src.checkpointers import async_checkpointer  # noqa: E402

import run  # noqa: E402
import txjax.training.loop  # noqa: E402


def _unhandled(signum, frame):
    raise AssertionError(f"{signal.Signals(signum).name} reached the test: the run did not handle it")


@contextlib.contextmanager
def inject(name: str, where: str, n: int):
    """Sends SIG<name> at the n-th `where` while inside; a TERM or INT that no run handles fails the test instead
    of ending it (pytest's own handlers are back afterwards)."""
    sig, count = getattr(signal, f"SIG{name}"), [0]

    def tick():
        count[0] += 1
        if count[0] == n:
            signal.raise_signal(sig)

    def counted_items(make):
        def make_counted(*args, **kwargs):
            for item in make(*args, **kwargs):
                tick()
                yield item

        return make_counted

    def tick_then_commit(*args, **kwargs):
        tick()
        return commit(*args, **kwargs)

    commit = async_checkpointer._on_commit_callback
    patches = {
        "batch": [(txjax.training.loop, "prefetch", counted_items(txjax.training.loop.prefetch))],
        "eval": [(txjax.training.loop, "eval_batches", counted_items(txjax.training.loop.eval_batches))],
        "save": [(async_checkpointer, "_on_commit_callback", tick_then_commit)],
    }[where]
    before = [(owner, attribute, getattr(owner, attribute)) for owner, attribute, _ in patches]
    handlers = {s: signal.signal(s, _unhandled) for s in (signal.SIGTERM, signal.SIGINT)}
    for owner, attribute, value in patches:
        setattr(owner, attribute, value)
    try:
        yield
    finally:
        for owner, attribute, value in before:
            setattr(owner, attribute, value)
        for s, handler in handlers.items():
            signal.signal(s, handler)


if __name__ == "__main__":
    name, where, n, *run_args = sys.argv[1:]
    with inject(name, where, int(n)):
        sys.exit(run.main(run_args))
