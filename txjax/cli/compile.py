"""`run.py compile`: a run's train (or eval, or decoding) step compiled for a TPU topology on this host, without its
chips (the tpu extra), and one JSON line of what XLA says of it: HBM per chip and whether it fits, FLOPs,
collectives, XLA's estimated step time (an estimate, not a measurement) and the MFU and tokens per second it implies
(decoding: the KV cache's bytes a chip holds, and tokens per second = the rows decoded / XLA's estimated step). A
step that does not fit exits 1 after one line saying what it needs and what would help. Nothing is written but
--save's file.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import sys
import tempfile
from pathlib import Path

import jax
from jax.errors import JaxRuntimeError

from txjax import config as config_lib
from txjax.cli import parse_with_overrides
from txjax.model.config import REMAT_POLICIES
from txjax.ops.memory import largest
from txjax.parallel.topology import GiB, parse_topology, topology_devices
from txjax.training import aot
from txjax.training.edge import prepare_run


def main(argv: list[str]) -> None:
    """run.py compile --topology=NAME [--num_slices=N] [--config=experiments/NAME.py] [--step=train|eval|decode]
    [--save=FILE] [--config.SECTION.FIELD=VALUE ...]"""
    parser = argparse.ArgumentParser(prog="run.py compile", description=main.__doc__, allow_abbrev=False)
    parser.add_argument("--topology", required=True, help="v5e:4x4, v5p:2x2x2, v4:2x2x2, v6e:8x8, or v5e-256, v5p-128")
    parser.add_argument("--num_slices", type=int, default=1, help="slices joined by the data-center network")
    parser.add_argument("--config", help=f"experiment file (default: {config_lib.DEFAULT_EXPERIMENT.name})")
    parser.add_argument(
        "--step",
        default="train",
        help="the step to compile: train, eval (the forward pass), decode (one cached decoding step of config.decode's "
        "strategy for train.batch_size prompts, its KV cache the model's whole context)",
    )
    parser.add_argument("--save", help="write the serialized executable here (and FILE.json: jax, libtpu versions)")
    parser.add_argument(
        "--search",
        choices=("batch", "remat"),
        help="batch: the largest train.batch_size that fits (bisection over compiles); remat: the model.remat policy "
        "that fits at the least cost (XLA's estimated time, else its FLOPs)",
    )
    args, overrides = parse_with_overrides(parser, argv)
    jax.config.update("jax_platforms", "cpu")  # no chip of this host is used (a TPU VM's may be training)

    if args.step not in aot.STEPS:
        raise config_lib.ConfigError(f"--step={args.step} is not a step: choose one of {', '.join(aot.STEPS)}")
    if args.num_slices < 1:
        raise config_lib.ConfigError(f"--num_slices={args.num_slices} must be at least 1")
    config = config_lib.from_command_line(args.config, overrides)
    topology = parse_topology(args.topology)
    if args.save and Path(args.save).is_dir():
        raise config_lib.ConfigError(f"--save={args.save} is a folder: give a file name")
    devices = topology_devices(topology, args.num_slices)
    with tempfile.TemporaryDirectory() as scratch:  # the tokenizer a run would save in its workdir
        spec, (_, train_data, _) = prepare_run(config, Path(scratch))
    first = train_data.batch(spec.train.seed, 0, spec.train.batch_size)
    chip = topology.chip
    result = {"topology": topology.name, "num_slices": args.num_slices, "step": args.step}
    versions = {"jax": jax.__version__, "libtpu": importlib.metadata.version("libtpu")}
    programs = {}  # (batch size, remat) -> Program: a search's answer was compiled as one of its trials

    def compile_for(spec, batch):
        key = (spec.train.batch_size, spec.model.remat)
        if key not in programs:
            programs[key] = aot.compile_step(spec, batch, devices, args.step, args.num_slices)
        return programs[key]

    if args.search:  # the trials' lines, then the answer's as any compile's, its "search" said
        search = search_batch if args.search == "batch" else search_remat
        spec, first = search(spec, train_data, first, compile_for, chip)
        result |= {"search": args.search}
    result |= {"batch_size": spec.train.batch_size, "remat": spec.model.remat}
    report = trial(compile_for, spec, first, chip)
    if "xla" in report:  # XLA refused temporaries beyond the chip's HBM: refused the same way
        print(json.dumps(result | {"fits": False, "chip_hbm_bytes": chip.hbm_bytes, "xla": report["xla"]} | versions))
        need = f"more HBM per chip than the {chip.hbm_bytes / GiB:.0f} GiB of a {topology.generation} chip"
        print(f"error: the {args.step} step needs {need} ({report['xla']}): {helps(spec, devices)}", file=sys.stderr)
        raise SystemExit(1)
    result |= report
    if args.save:  # the program the report is of (compile_for keeps it)
        save_executable(compile_for(spec, first).compiled, Path(args.save), result | versions)
    print(json.dumps(result | versions))
    if not result["fits"]:
        memory = result["hbm_per_chip_bytes"]
        need = (
            f"{memory['total'] / GiB:.2f} GiB of HBM per chip ({memory['arguments'] / GiB:.2f} GiB arguments, "
            f"{memory['temporaries'] / GiB:.2f} GiB temporaries), more than the {chip.hbm_bytes / GiB:.0f} GiB of a "
            f"{topology.generation} chip"
        )
        print(f"error: the {args.step} step needs {need}: {helps(spec, devices)}", file=sys.stderr)
        raise SystemExit(1)


def xla_refusal(error: JaxRuntimeError) -> str:
    """XLA's reason for refusing a program (its first line, after RESOURCE_EXHAUSTED)."""
    return str(error).splitlines()[0].partition("RESOURCE_EXHAUSTED: ")[2]


def trial(compile_step, spec, batch, chip) -> dict:
    """One search trial: the step compiled (compile_step) and reported, or {"fits": False, "xla": why} when XLA
    refuses it for the chip's HBM."""
    try:
        return aot.report(compile_step(spec, batch), chip.hbm_bytes, chip.bf16_flops)
    except JaxRuntimeError as e:  # XLA refuses temporaries beyond the chip's HBM
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        return {"fits": False, "xla": xla_refusal(e)}


def trial_line(name: str, value, report: dict) -> str:
    """A trial's JSON line: what was tried, whether it fits, its HBM per chip and XLA's estimated time and FLOPs (or
    XLA's reason for refusing it)."""
    keep = ("fits", "flops_per_step", "estimated_step_seconds", "xla")
    hbm = report.get("hbm_per_chip_bytes", {}).get("total")
    return json.dumps(
        {"trial": name, name: value, "hbm_per_chip_bytes": hbm} | {k: report[k] for k in keep if k in report}
    )


def search_batch(spec, train_data, first, compile_step, chip):
    """(spec, first batch) at the largest train.batch_size whose step fits a chip's HBM: a multiple of the rows the
    mesh's batch axes and grad_accum split it into (a unit), from the config's batch doubled while it fits (halved
    while it does not), then bisected; each trial one JSON line on stdout. The spec and `first` unchanged when not
    even one unit fits (the caller refuses it)."""
    unit = spec.mesh.data * spec.mesh.fsdp * spec.mesh.expert * spec.train.grad_accum
    at = lambda n: dataclasses.replace(spec, train=dataclasses.replace(spec.train, batch_size=n * unit))
    batch = lambda n: train_data.batch(spec.train.seed, 0, n * unit)
    tried = {}

    def fits(n: int) -> bool:
        if n not in tried:
            report = trial(compile_step, at(n), batch(n), chip)
            tried[n] = report["fits"]
            print(trial_line("batch_size", n * unit, report), flush=True)
        return tried[n]

    n = largest_from(fits, max(1, spec.train.batch_size // unit))
    return (at(n), batch(n)) if n else (spec, first)


def search_remat(spec, train_data, first, compile_step, chip):
    """(spec, first) with the model.remat policy whose step fits a chip's HBM at the least cost (cheapest); each
    policy's trial one JSON line on stdout. The spec unchanged when none fits (the caller refuses it)."""
    trials = {}
    for policy in REMAT_POLICIES:
        at = dataclasses.replace(spec, model=dataclasses.replace(spec.model, remat=policy))
        report = trial(compile_step, at, first, chip)
        trials[policy] = {k: report.get(k) for k in ("fits", "flops_per_step", "estimated_step_seconds")}
        print(trial_line("remat", policy, report), flush=True)
    best = cheapest(trials)
    return (dataclasses.replace(spec, model=dataclasses.replace(spec.model, remat=best)) if best else spec), first


def cheapest(trials: dict) -> str | None:
    """The trial that fits at the least cost: XLA's estimated step seconds where every fitting trial has one (its cost
    model gives none for some programs), else its FLOPs per step (recomputation's cost); None when none fits."""
    fitting = {name: t for name, t in trials.items() if t["fits"]}
    timed = all(t["estimated_step_seconds"] for t in fitting.values())
    key = "estimated_step_seconds" if timed else "flops_per_step"
    return min(fitting, key=lambda name: fitting[name][key], default=None)


def largest_from(fits, start: int, cap: int = 2**20) -> int:
    """The largest n >= 1 with fits(n) (monotonic), 0 if none: from `start`, doubled while it fits or halved while it
    does not, then bisected between the last that fits and the first that does not."""
    n = min(start, cap)
    if fits(n):
        while n < cap and fits(2 * n):
            n *= 2
        return largest(fits, min(2 * n - 1, cap), low=n)
    while n > 1:
        failed, n = n, n // 2
        if fits(n):
            return largest(fits, failed - 1, low=n)
    return 0


def helps(spec, devices: list) -> str:
    """What would make a step that does not fit a chip's HBM fit."""
    ways = []
    if spec.mesh.fsdp < len(devices):
        ways.append("shard the parameters and optimizer state over more chips (--config.mesh.fsdp)")
    if spec.model.remat == "none":
        ways.append("recompute activations (--config.model.remat=full or a policy)")
    ways.append(f"a smaller --config.train.batch_size (now {spec.train.batch_size}) or more --config.train.grad_accum")
    return "; or ".join(ways)


def save_executable(compiled, path: Path, record: dict) -> None:
    """The serialized executable (jax.experimental.serialize_executable) in `path`, and `record` (the versions it
    needs to be loaded with among it) in path + '.json'."""
    from jax.experimental.serialize_executable import serialize

    payload, _, _ = serialize(compiled)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(payload)
    Path(f"{path}.json").write_text(json.dumps(record, indent=1) + "\n")
