"""txjax command line: `python run.py SUBCOMMAND [flags]` (`python run.py` lists the subcommands).

Each subcommand is one entry of COMMANDS: a module and the name of its `main(argv)`. A user error (bad config key
or value, missing data file, diverged loss, a workdir another run is writing) ends with one line on stderr and exit
status 2, without a traceback. SIGTERM or Ctrl-C during `train` or `sweep` saves a checkpoint of the current step and
ends with the line "stopped by SIGTERM at step N; checkpoint saved; run the same command to resume" and exit status
75 (txjax.preemption.EXIT_STATUS, EX_TEMPFAIL); a second signal stops at once.
"""

import importlib
import sys

COMMANDS = {  # name -> (module, function(argv: list[str]))
    "train": ("txjax.train", "main"),
    "eval": ("txjax.evaluate", "main"),
    "sweep": ("txjax.sweep", "main"),
    "generate": ("txjax.decode", "main"),
    "import-gpt2": ("txjax.convert.workdir", "main"),
    "attention": ("txjax.viz", "main"),
    "inspect": ("txjax.summary", "main"),
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        print(
            f"usage: python run.py {{{','.join(COMMANDS)}}} [flags]   (python run.py COMMAND --help)", file=sys.stderr
        )
        return 0 if argv[:1] in ([], ["-h"], ["--help"]) else 2
    from txjax.config import ConfigError
    from txjax.preemption import EXIT_STATUS, Preempted
    from txjax.train import Diverged

    module, function = COMMANDS[argv[0]]
    try:
        getattr(importlib.import_module(module), function)(argv[1:])
    except (ConfigError, Diverged) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Preempted as e:
        print(e, file=sys.stderr)
        return EXIT_STATUS
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
