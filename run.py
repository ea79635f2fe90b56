"""txjax command line: `python run.py SUBCOMMAND [flags]` (`python run.py` lists the subcommands).

Each subcommand is one entry of COMMANDS: a module of txjax/cli with its `main(argv)`. A user error (bad config key or
value, missing data file, diverged loss, a workdir another run is writing, an optional package not installed) ends with
one line on stderr and exit status 2, without a traceback; so does XLA's out of memory (txjax.ops.memory, which also
refuses a train step that cannot fit before compiling it). SIGTERM or Ctrl-C during `train` or `sweep` saves a
checkpoint of the current step and ends with the line "stopped by SIGTERM at step N; checkpoint saved; run the same
command to resume" and exit status 75 (txjax.ops.preemption.EXIT_STATUS, EX_TEMPFAIL); a second signal stops at once.
Every other command stopped by SIGTERM or Ctrl-C ends with one line saying what was kept ("stopped by SIGINT;
nothing written", txjax.ops.preemption.KEPT) and exit status 128 + the signal (130 for SIGINT, 143 for SIGTERM),
wherever it arrives: while the command's modules import (recorded, acted on after), or inside a garbage-collection
callback or finalizer (acted on just after it: txjax.ops.preemption.stop_on_signals). A signal after the work is done
(import, export and prepare once their output is in place; any command once it returned status 0, during the
interpreter's teardown) ends with status 0 and the line "SIGTERM arrived after run.py import completed its work;
nothing was lost (exit 0)" (txjax.ops.preemption.complete, .after_work).
"""

import importlib
import signal
import sys

COMMANDS = {  # name -> module of txjax/cli with main(argv: list[str])
    "train": "txjax.cli.train",
    "eval": "txjax.cli.eval",
    "sweep": "txjax.cli.sweep",
    "generate": "txjax.cli.generate",
    "import": "txjax.cli.import_model",
    "export": "txjax.cli.export",
    "attention": "txjax.cli.attention",
    "inspect": "txjax.cli.inspect",
    "prepare": "txjax.cli.prepare",
    "lm-eval": "txjax.cli.lm_eval",
    "compile": "txjax.cli.compile",
}


def main(argv: list[str], exiting: bool = False) -> int:
    """The command's exit status; `exiting` (run.py as a script: the process ends after it): a status 0 is kept
    whatever signal arrives in the teardown after it (preemption.after_work)."""
    if not argv or argv[0] not in COMMANDS:
        print(
            f"usage: python run.py {{{','.join(COMMANDS)}}} [flags]   (python run.py COMMAND --help)", file=sys.stderr
        )
        return 0 if argv[:1] in ([], ["-h"], ["--help"]) else 2
    received: list[int] = []  # a signal during the imports (seconds): recorded, acted on once they are done
    before = {
        s: signal.signal(s, lambda signum, frame: received.append(signum)) for s in (signal.SIGTERM, signal.SIGINT)
    }
    status = None
    try:
        status = _run(argv, received)
        return status
    finally:
        if exiting and status == 0:
            from txjax.ops.preemption import after_work

            after_work(argv[0])
        else:
            for s, handler in before.items():
                signal.signal(s, handler)


def _run(argv: list[str], received: list[int]) -> int:
    from jax.errors import JaxRuntimeError

    from txjax.cli import COMPILING_COMMANDS, enable_compilation_cache
    from txjax.config import ConfigError
    from txjax.errors import check_symlink_loops, symlink_loop_line
    from txjax.extras import MissingExtra
    from txjax.ops.memory import out_of_memory_line
    from txjax.ops.preemption import (
        EXIT_STATUS,
        Preempted,
        Stopped,
        after_work_line,
        recorded_signal,
        stop_on_signals,
        work_complete,
    )
    from txjax.parallel.platforms import leave_out_absent_tpu
    from txjax.training.run import Diverged

    leave_out_absent_tpu()  # before any backend starts
    if argv[0] in COMPILING_COMMANDS:
        enable_compilation_cache()
    try:
        with stop_on_signals():
            if received:
                raise Stopped(received[0])
            check_symlink_loops(argv[1:])
            importlib.import_module(COMMANDS[argv[0]]).main(argv[1:])
            if (signum := recorded_signal()) is not None and work_complete():
                print(after_work_line(signum, argv[0]), file=sys.stderr)
            elif signum is not None:  # a library caught the Stopped: the command still stops
                raise Stopped(signum)
    except (ConfigError, Diverged, MissingExtra) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except JaxRuntimeError as e:  # XLA's out of memory (at compile or run time) is one line; anything else is a bug
        if (line := out_of_memory_line(e)) is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        return 2
    except Preempted as e:
        print(e, file=sys.stderr)
        return EXIT_STATUS
    except Stopped as e:
        print(e.line(argv[0]), file=sys.stderr)
        return e.status
    except (RuntimeError, OSError) as e:  # a path given that loops: one line; anything else is a bug
        if (line := symlink_loop_line(e)) is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], exiting=True))
