"""The command line: one module per `run.py` subcommand, each with `main(argv)` that parses flags and calls the
library. Library modules take arguments; only this package (and run.py) parses them."""

from __future__ import annotations

import argparse
import os

from txjax.parallel import distributed

# the commands whose compiled steps the persistent compilation cache keeps (enable_compilation_cache)
COMPILING_COMMANDS = ("train", "eval", "generate", "sweep", "lm-eval")


def enable_compilation_cache() -> None:
    """jax's persistent compilation cache: a second run of the same config loads its compiled steps (those that took
    over a second to compile) instead of compiling them again. In $JAX_COMPILATION_CACHE_DIR when that is set, else
    in txjax's cache folder ($TXJAX_CACHE_DIR, default ~/.cache/txjax)/jax; TXJAX_COMPILATION_CACHE=0 turns it off."""
    import jax

    from txjax.ops.peak import cache_dir

    if os.environ.get("TXJAX_COMPILATION_CACHE", "1") != "0" and not jax.config.jax_compilation_cache_dir:
        jax.config.update("jax_compilation_cache_dir", str(cache_dir() / "jax"))


def parse_with_overrides(
    parser: argparse.ArgumentParser, argv: list[str], prefix: str | tuple[str, ...] = "--config."
) -> tuple[argparse.Namespace, list[str]]:
    """(args, overrides): the parser's flags, and every other flag, each of which must start with `prefix` (or one
    of several) (`--config.SECTION.FIELD=VALUE`, applied later by txjax.config); a prefix ending in "=" names one
    field (`--config.data.seq_len=`)."""
    args, overrides = parser.parse_known_args(argv)
    for flag in overrides:
        if not flag.startswith(prefix):
            prefixes = (prefix,) if isinstance(prefix, str) else prefix
            takes = " or ".join(f"{p}VALUE" if p.endswith("=") else f"{p}*=VALUE" for p in prefixes)
            parser.error(f"unrecognized argument {flag} (this command takes {takes} overrides)")
    return args, overrides


def add_distributed_flags(parser: argparse.ArgumentParser) -> None:
    """The multi-process flags of `run.py train` and `run.py eval`."""
    group = parser.add_argument_group("multi-process (jax.distributed; omit all for one process)")
    group.add_argument(
        "--coordinator_address",
        default=os.environ.get("JAX_COORDINATOR_ADDRESS"),
        help="HOST:PORT of process 0, the same for every process (env JAX_COORDINATOR_ADDRESS)",
    )
    group.add_argument(
        "--num_processes",
        type=int,
        default=os.environ.get("JAX_NUM_PROCESSES"),
        help="processes in the run, usually one per host (env JAX_NUM_PROCESSES)",
    )
    group.add_argument(
        "--process_id",
        type=int,
        default=os.environ.get("JAX_PROCESS_ID"),
        help="this process, 0 .. num_processes - 1 (env JAX_PROCESS_ID)",
    )
    group.add_argument(
        "--distributed",
        action="store_true",
        help="initialize jax.distributed, detecting what is not given from the cluster (SLURM, Cloud TPU, ...)",
    )
    group.add_argument(
        "--initialization_timeout",
        type=int,
        default=300,
        help="seconds to wait for every process to join (default 300)",
    )
    group.add_argument(
        "--heartbeat_timeout",
        type=int,
        default=60,
        help="seconds after which a silent process is declared dead and the others stop (default 60)",
    )


def initialize_distributed(args: argparse.Namespace) -> None:
    """jax.distributed from the flags of add_distributed_flags (nothing when none is given)."""
    distributed.initialize(
        args.coordinator_address,
        args.num_processes,
        args.process_id,
        detect=args.distributed,
        initialization_timeout=args.initialization_timeout,
        heartbeat_timeout=args.heartbeat_timeout,
    )
