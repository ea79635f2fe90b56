"""`run.py sweep`: train every run of a sweep file (vmapped groups where they can share a program), in this process
or as Ray Tune trials (--launcher=ray), then report; exit status 1 when a run failed."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from txjax.cli import parse_with_overrides
from txjax.config import ConfigError
from txjax.sweep.local import run_sweep
from txjax.sweep.spec import load_sweep


def main(argv: list[str]) -> None:
    """run.py sweep --sweep=experiments/ablations/NAME.py --workdir=DIR [--no-vmap] [--launcher=ray
    [--address=auto|HOST:PORT] [--run_resources='{"CPU": 1}'] [--max_concurrent=N]] [--config.SECTION.FIELD=VALUE]"""
    parser = argparse.ArgumentParser(prog="run.py sweep", description=main.__doc__, allow_abbrev=False)
    parser.add_argument("--sweep", required=True, help="sweep file (get_sweep())")
    parser.add_argument("--workdir", help="sweep folder (default: runs/sweeps/<sweep name>); resumes if it has one")
    parser.add_argument(
        "--vmap",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="train runs that differ only in seed / optimizer scalars together (default: on)",
    )
    parser.add_argument("--launcher", choices=["ray"], help="ray: each group is a Ray Tune trial (the sweep extra)")
    ray = parser.add_argument_group("--launcher=ray (the sweep folder must be on storage every node shares)")
    ray.add_argument("--address", help="the Ray cluster: auto, or HOST:PORT (default: start one on this machine)")
    ray.add_argument("--run_resources", help="resources of one trial, JSON: '{\"CPU\": 1}', '{\"GPU\": 1}'")
    ray.add_argument("--max_concurrent", type=int, default=0, help="trials at once (default: as resources allow)")
    ray.add_argument("--max_failures", type=int, default=3, help="retries of a trial whose process dies")
    args, overrides = parse_with_overrides(parser, argv)
    workdir = args.workdir or Path("runs") / "sweeps" / Path(args.sweep).stem
    command = "python run.py sweep " + " ".join(shlex.quote(a) for a in argv)
    ray_flags = [f for f in ("address", "run_resources", "max_concurrent") if getattr(args, f)]
    if ray_flags and args.launcher != "ray":
        raise ConfigError(f"--{', --'.join(ray_flags)}: only with --launcher=ray")
    sweep = load_sweep(args.sweep)
    try:
        if args.launcher == "ray":
            from txjax.sweep.ray_launcher import run_on_ray

            resources = _resources(args.run_resources)
            runs = run_on_ray(
                sweep,
                workdir,
                overrides,
                args.vmap,
                command,
                args.address,
                resources,
                args.max_concurrent,
                args.max_failures,
            )
        else:
            runs = run_sweep(sweep, workdir, overrides, args.vmap, command)
    except KeyboardInterrupt:
        print(f"\ninterrupted: run the same command again to resume {workdir}", file=sys.stderr)
        raise SystemExit(130) from None
    failed = sum(r.result.get("status") == "failed" for r in runs)
    stopped = sum(r.result.get("status") == "stopped" for r in runs)
    print(json.dumps({"workdir": str(workdir), "runs": len(runs), "failed": failed, "stopped": stopped}))
    if failed:
        print(
            f"error: {failed} of {len(runs)} runs failed (their errors: {Path(workdir) / 'results.md'}); the same "
            "command trains them again",
            file=sys.stderr,
        )
        raise SystemExit(1)


def _resources(text: str | None) -> dict | None:
    """--run_resources' JSON object of Ray resource amounts, or None."""
    if text is None:
        return None
    try:
        resources = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"--run_resources={text}: not JSON ({e}); e.g. '{{\"CPU\": 1}}'") from None
    if not isinstance(resources, dict) or not all(isinstance(v, int | float) and v >= 0 for v in resources.values()):
        raise ConfigError(f'--run_resources={text}: give a JSON object of amounts, e.g. \'{{"CPU": 1, "GPU": 1}}\'')
    return resources
