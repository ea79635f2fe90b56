"""txjax command line: `python run.py SUBCOMMAND [flags]` (`python run.py` lists the subcommands).

Each subcommand is one entry of COMMANDS: a module of txjax/cli with its `main(argv)`. A user error (bad config key or
value, missing data file, diverged loss, a workdir another run is writing, an optional package not installed) ends with
one line on stderr and exit status 2, without a traceback. SIGTERM or Ctrl-C during `train` or `sweep` saves a
checkpoint of the current step and ends with the line "stopped by SIGTERM at step N; checkpoint saved; run the same
command to resume" and exit status 75 (txjax.preemption.EXIT_STATUS, EX_TEMPFAIL); a second signal stops at once.
"""

import importlib
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
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        print(
            f"usage: python run.py {{{','.join(COMMANDS)}}} [flags]   (python run.py COMMAND --help)", file=sys.stderr
        )
        return 0 if argv[:1] in ([], ["-h"], ["--help"]) else 2
    from txjax.cli import COMPILING_COMMANDS, enable_compilation_cache
    from txjax.config import ConfigError
    from txjax.extras import MissingExtra
    from txjax.preemption import EXIT_STATUS, Preempted
    from txjax.train import Diverged

    if argv[0] in COMPILING_COMMANDS:
        enable_compilation_cache()
    try:
        importlib.import_module(COMMANDS[argv[0]]).main(argv[1:])
    except (ConfigError, Diverged, MissingExtra) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Preempted as e:
        print(e, file=sys.stderr)
        return EXIT_STATUS
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
