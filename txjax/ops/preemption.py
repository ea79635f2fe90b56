"""Preemption: SIGTERM or SIGINT stops training at a step boundary with a checkpoint, instead of mid-step with none.

Cloud and cluster schedulers preempt a job with SIGTERM (and SIGKILL it a grace period later); Ctrl-C sends SIGINT.
Inside `watch()` either signal only sets a flag (a second one acts at once: SIGTERM kills, SIGINT raises
KeyboardInterrupt). The training loop calls `stop_at(step)` after every step; once it returns True the loop saves a
checkpoint of that step and `raise_if_stopped` raises `Preempted` after it; the checkpoint is on disk before the
command ends with the one line
    stopped by SIGTERM at step N; checkpoint saved; run the same command to resume
and exit status EXIT_STATUS = 75 (sysexits' EX_TEMPFAIL: "temporary failure, try again"), which a job script can
test to requeue the same command. Evaluation batches pass through `interruptible`, so a long eval cannot outlast
the grace period: it is dropped and the step before it is saved.

With several processes (jax.distributed) all must stop at the same step or the checkpoint would be partial: the
flags are combined by a one-integer all-gather at the loop's log steps (`sync`), and every process acts on the
combined value only, so all stop at the first log step after any of them was signalled. Evaluation is then not cut
short (a process leaving an eval early would leave the others waiting in its collectives).

Every other command (eval, generate, lm-eval, import, export, prepare) runs inside `stop_on_signals`: the handler
records the signal and raises Stopped where the main thread is. Where that is a garbage-collection callback (JAX's
`_xla_gc_callback`), a finalizer or a weakref callback, Python would print the exception and drop it ("Exception
ignored in ...") and let the command finish with exit status 0: every such drop goes through sys.unraisablehook, where
a dropped Stopped sends the signal to the main thread again 10 ms later, until it lands at a safe point. run.py also
ends a command that returns with a signal recorded with the signal's line and status.

A signal after the work is done is no failure: a job script that sees 130 or 143 retries, and a retried import fails
on the folder the first one wrote. A command whose output is in place calls `complete()` before printing its summary
(import, export, prepare); from then on a signal is only recorded, and run.py prints `after_work_line` and ends with
status 0. So does a signal during the interpreter's teardown after any command returned status 0 (`after_work`: the
summary printed, the exit handlers of JAX, orbax and the data loaders still to run); a second one there acts at once.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading

import jax
import numpy as np
from jax.experimental import multihost_utils

from txjax.ops.metrics_log import read_metrics

EXIT_STATUS = 75
SIGNALS = (signal.SIGTERM, signal.SIGINT)
KEPT = {  # what a command stopped by a signal outside `watch` leaves on disk (run.py's line)
    "train": "the workdir keeps its last saved checkpoint; run the same command to resume",
    "sweep": "each run's workdir keeps its last saved checkpoint; run the same command to resume",
    "prepare": "nothing written (the DIR.partial-PID folder is removed); run the same command to start again",
    "generate": "nothing written (what was generated is printed above)",
}

_state = {"received": None, "stopped": False, "step": None, "depth": 0, "previous": {}}


class Preempted(BaseException):
    """The run stopped for a signal after saving its checkpoint. A BaseException, as KeyboardInterrupt is, so that
    code that contains a run's failure (`except Exception` in a sweep) lets the stop through."""

    def __init__(self):
        self.signal_name = _state["received"] or "a signal to another process"
        self.step = _state["step"]
        where = f"at step {self.step}; checkpoint saved" if self.step is not None else "between runs"
        super().__init__(f"stopped by {self.signal_name} {where}; run the same command to resume")


class Stopped(BaseException):
    """A signal outside `watch`: raised where the main thread is, so `finally` blocks clean up (a partial folder is
    removed, worker processes are stopped) before run.py prints `line` and exits with `status` (128 + signal)."""

    def __init__(self, signum: int):
        self.status = 128 + signum
        super().__init__(signal.Signals(signum).name)

    def line(self, command: str) -> str:
        return f"stopped by {self}; {KEPT.get(command, 'nothing written')}"


_recorded = {"signum": None, "complete": False}  # the signal stop_on_signals' handler received; complete()
REDELIVER_S = 0.01  # how soon a signal whose Stopped Python dropped is sent again


def _raise_stopped(signum, frame) -> None:
    """stop_on_signals' handler: records the signal and raises Stopped where the main thread is (if Python drops
    it there, _resend_dropped sends the signal again)."""
    _recorded["signum"] = signum
    if _recorded["complete"]:  # the work is done: run.py says so and ends with 0
        return
    raise Stopped(signum)


def _resend_dropped(before):
    """A sys.unraisablehook that takes a Stopped raised inside a gc callback, finalizer or weakref callback (which
    Python reports here and drops) and sends its signal to the main thread again in REDELIVER_S (to _raise_stopped,
    if it is still the handler installed); as the main thread's syscalls are interrupted by it, it acts at the next
    safe point. Every other report goes to `before`. Which frames drop exceptions is not guessed: the frame the
    handler ran in can be any weakref callback of any library's (WeakSet's, in one run on Python 3.13)."""

    def hook(report) -> None:
        if not isinstance(report.exc_value, Stopped):
            return before(report)
        signum = report.exc_value.status - 128
        timer = threading.Timer(REDELIVER_S, _redeliver, (signum,))
        timer.daemon = True
        timer.start()

    hook.resends_dropped_stops = True
    return hook


def _redeliver(signum: int) -> None:
    if signal.getsignal(signum) is _raise_stopped:
        signal.pthread_kill(threading.main_thread().ident, signum)


def recorded_signal() -> int | None:
    """The signal stop_on_signals' handler received (None: none): run.py ends with it even if a library caught the
    Stopped it raised."""
    return _recorded["signum"]


def complete() -> None:
    """The command's work is done, its output in place (called just before its summary line is printed): a signal
    from now on no longer stops it (run.py prints after_work_line and ends with status 0). One that came before
    (a library caught its Stopped) still stops it: the work it interrupted may be partial."""
    _recorded["complete"] = _recorded["signum"] is None


def work_complete() -> bool:
    """Whether the command inside stop_on_signals called complete()."""
    return _recorded["complete"]


def after_work_line(signum: int, command: str) -> str:
    """What run.py prints for a signal that arrived once `command`'s work was done."""
    return f"{signal.Signals(signum).name} arrived after run.py {command} completed its work; nothing was lost (exit 0)"


def after_work(command: str) -> None:
    """Installs, for the process's teardown after `command` returned status 0, handlers that print after_work_line
    for the first signal (the status stays 0) and give the next one its default action."""

    def handler(signum, frame):
        for s in SIGNALS:
            signal.signal(s, signal.SIG_DFL)
        print(after_work_line(signum, command), file=sys.stderr, flush=True)

    for s in SIGNALS:
        signal.signal(s, handler)


@contextlib.contextmanager
def stop_on_signals():
    """SIGTERM and SIGINT raise Stopped while inside, at a safe point (_raise_stopped) (run.py: around every
    command; train's `watch` takes over inside it and gives the second signal back to it)."""
    _recorded.update(signum=None, complete=False)
    if not getattr(sys.unraisablehook, "resends_dropped_stops", False):  # kept after the block: it passes the rest on
        sys.unraisablehook = _resend_dropped(sys.unraisablehook)
    previous = {s: signal.signal(s, _raise_stopped) for s in SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def starting_processes():
    """Around starting worker processes: SIGTERM waits until the end of the block, then acts (e.g. raises
    Stopped, where the caller can stop the workers); SIGINT is ignored during it, so processes started inside ignore
    it from their first instruction (a Ctrl-C reaches the terminal's whole process group: the parent alone reports
    it, not each worker with a traceback from its imports). Keep it short: a Ctrl-C inside is lost."""
    received = []
    previous_term = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    previous_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous_int)
        signal.signal(signal.SIGTERM, previous_term)
    if received:
        signal.raise_signal(signal.SIGTERM)  # to the handler restored


@contextlib.contextmanager
def watch():
    """SIGTERM and SIGINT set the flag while inside (re-entrant: a sweep's watch covers the runs it trains)."""
    outermost = _state["depth"] == 0 and threading.current_thread() is threading.main_thread()
    if outermost:
        _state.update(received=None, stopped=False, step=None)
        _state["previous"] = {s: signal.signal(s, _handle) for s in SIGNALS}
    _state["depth"] += 1
    try:
        yield
    finally:
        _state["depth"] -= 1
        if outermost:
            _restore()


def _handle(signum, frame) -> None:
    _state["received"] = signal.Signals(signum).name
    _restore()  # the second signal acts at once


def _restore() -> None:
    for s, handler in _state["previous"].items():
        signal.signal(s, signal.SIG_DFL if handler is None else handler)  # None: a handler set outside Python


def request(reason: str) -> None:
    """Stops training as a signal does (the loop saves its current step, then Preempted), asked for by code: a
    sweep's Ray trial whose driver received the signal (txjax.sweep.ray_launcher). `reason` names the signal."""
    _state["received"] = reason


def received() -> str | None:
    """The name of the signal received inside watch() (or of request's reason), None while there is none."""
    return _state["received"]


def stop_at(step: int, sync: bool) -> bool:
    """Whether the run stops after `step` (every process gets the same answer): one process reads its flag, several
    combine theirs when `sync` (at the same steps in every process) and keep the last combined answer otherwise."""
    if jax.process_count() == 1:
        _state["stopped"] = _state["received"] is not None
    elif sync:
        flags = multihost_utils.process_allgather(np.int32(_state["received"] is not None))
        _state["stopped"] = bool(np.any(flags))
    _state["step"] = step
    return _state["stopped"]


def raise_if_stopped() -> None:
    """Raises Preempted when the last stop_at said stop (the caller saved that step's checkpoint)."""
    if _state["stopped"]:
        raise Preempted()


def raise_if_signalled() -> None:
    """Raises Preempted between runs (a sweep), where no step is in flight."""
    if _state["received"] is not None:
        _state.update(stopped=True, step=None)
        raise Preempted()


def owed_eval(workdir, start: int, eval_every: int, steps: int) -> bool:
    """Whether the periodic eval (every `eval_every` of the run's `steps`) of the resumed step `start` is owed: due
    there, and missing from metrics.jsonl because a signal cut it short or stopped the run at that step. The resumed
    run does it first, so its records are those of a run never stopped. One process only (others cannot cut an
    eval short)."""
    due = eval_every > 0 and 0 < start < steps and start % eval_every == 0
    if not due or jax.process_count() > 1:
        return False
    _state["step"] = start  # the step a signal during this eval stops at
    return not any(r["step"] == start and r["split"] == "valid" for r in read_metrics(workdir))


def interruptible(items):
    """Yields `items` until a signal arrives (one process only), then raises Preempted: the caller saves the step
    the evaluation followed (the last stop_at), not a partial evaluation."""
    with contextlib.closing(iter(items)) as items:  # closing: a prefetching producer stops with the eval
        for item in items:
            if jax.process_count() == 1 and _state["received"] is not None:
                _state["stopped"] = True
                raise Preempted()
            yield item
