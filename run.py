"""txjax command line: `python run.py SUBCOMMAND [flags]` (`python run.py` lists the subcommands).

Each subcommand is one entry of COMMANDS: a module and the name of its `main(argv)`. A user error (bad config key
or value, missing data file, diverged loss) ends with one line on stderr and exit status 2, without a traceback.
"""

import importlib
import sys

COMMANDS = {  # name -> (module, function(argv: list[str]))
    "train": ("txjax.train", "main"),
    "eval": ("txjax.evaluate", "main"),
    "sweep": ("txjax.sweep", "main"),
    "generate": ("txjax.decode", "main"),
    "import": ("txjax.cli.import_model", "main"),
    "export": ("txjax.cli.export", "main"),
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
    from txjax.train import Diverged

    module, function = COMMANDS[argv[0]]
    try:
        getattr(importlib.import_module(module), function)(argv[1:])
    except (ConfigError, Diverged) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
