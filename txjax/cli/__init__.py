"""The command line: one module per `run.py` subcommand, each with `main(argv)` that parses flags and calls the
library. Library modules take arguments; only this package (and run.py) parses them."""
