"""`run.py compile`: a run's train (or eval) step compiled for a TPU topology on this host, without its chips (the
tpu extra), and one JSON line of what XLA says of it: HBM per chip and whether it fits, FLOPs, collectives, XLA's
estimated step time (an estimate, not a measurement) and the MFU and tokens per second it implies. A step that does
not fit exits 1 after one line saying what it needs and what would help. Nothing is written but --save's file.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
import tempfile
from pathlib import Path

from txjax import config as config_lib
from txjax.cli import parse_with_overrides
from txjax.parallel.topology import GiB, parse_topology, topology_devices


def main(argv: list[str]) -> None:
    """run.py compile --topology=NAME [--num_slices=N] [--config=experiments/NAME.py] [--step=train|eval]
    [--save=FILE] [--config.SECTION.FIELD=VALUE ...]"""
    parser = argparse.ArgumentParser(prog="run.py compile", description=main.__doc__, allow_abbrev=False)
    parser.add_argument("--topology", required=True, help="v5e:4x4, v5p:2x2x2, v4:2x2x2, v6e:8x8, or v5e-256, v5p-128")
    parser.add_argument("--num_slices", type=int, default=1, help="slices joined by the data-center network")
    parser.add_argument("--config", help=f"experiment file (default: {config_lib.DEFAULT_EXPERIMENT.name})")
    parser.add_argument("--step", default="train", choices=("train", "eval"), help="the step to compile")
    parser.add_argument("--save", help="write the serialized executable here (and FILE.json: jax, libtpu versions)")
    args, overrides = parse_with_overrides(parser, argv)
    import jax

    jax.config.update("jax_platforms", "cpu")  # no chip of this host is used (a TPU VM's may be training)
    from txjax.training import aot
    from txjax.training.edge import prepare_run

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
    try:
        program = aot.compile_step(spec, first, devices, args.step, args.num_slices)
    except jax.errors.JaxRuntimeError as e:  # XLA refuses temporaries beyond the chip's HBM: refused the same way
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        xla = str(e).splitlines()[0].partition("RESOURCE_EXHAUSTED: ")[2]
        print(json.dumps(result | {"fits": False, "chip_hbm_bytes": chip.hbm_bytes, "xla": xla} | versions))
        need = f"more HBM per chip than the {chip.hbm_bytes / GiB:.0f} GiB of a {topology.generation} chip ({xla})"
        print(f"error: the {args.step} step needs {need}: {helps(spec, devices)}", file=sys.stderr)
        raise SystemExit(1) from None
    result |= aot.report(program, chip.hbm_bytes, chip.bf16_flops)
    if args.save:
        save_executable(program.compiled, Path(args.save), result | versions)
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
