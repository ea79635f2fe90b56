"""The processes and devices of a run: JAX's multi-controller runtime and the run's mesh.

Past one machine, txjax runs one process per host, each the same program (`run.py train ...`).
`jax.distributed.initialize` connects them through a coordinator service on process 0's host; afterwards
`jax.devices()` lists the devices of every process, one mesh spans them all, and each jitted step runs on all of
them at once (XLA inserts the collectives; gloo carries them between CPU processes). Each process feeds only its
own rows of every global batch (sharding.process_rows / global_batch).

Flags (also read from the environment): --coordinator_address HOST:PORT (JAX_COORDINATOR_ADDRESS),
--num_processes (JAX_NUM_PROCESSES), --process_id (JAX_PROCESS_ID); or --distributed alone on a cluster JAX
recognises (SLURM, Cloud TPU, Kubernetes, Open MPI) to detect them. With none, the run is one process, unchanged.
A process that dies is noticed by the others within --heartbeat_timeout seconds, and they exit with an error.
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import sys

import jax
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from txjax.config import ConfigError
from txjax.sharding import make_mesh

_ENV = {
    "coordinator_address": "JAX_COORDINATOR_ADDRESS",
    "num_processes": "JAX_NUM_PROCESSES",
    "process_id": "JAX_PROCESS_ID",
}


def add_flags(parser: argparse.ArgumentParser) -> None:
    """The multi-process flags of `run.py train` and `run.py eval`."""
    group = parser.add_argument_group("multi-process (jax.distributed; omit all for one process)")
    group.add_argument(
        "--coordinator_address",
        default=os.environ.get(_ENV["coordinator_address"]),
        help="HOST:PORT of process 0, the same for every process (env JAX_COORDINATOR_ADDRESS)",
    )
    group.add_argument(
        "--num_processes",
        type=int,
        default=os.environ.get(_ENV["num_processes"]),
        help="processes in the run, usually one per host (env JAX_NUM_PROCESSES)",
    )
    group.add_argument(
        "--process_id",
        type=int,
        default=os.environ.get(_ENV["process_id"]),
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


def initialize(args: argparse.Namespace) -> None:
    """jax.distributed.initialize from the flags when any is given (before anything touches a device)."""
    given = {name: getattr(args, name) for name in _ENV if getattr(args, name) is not None}
    if not given and not args.distributed:
        return
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU processes; no effect on GPU/TPU
    print(
        f"jax.distributed: joining {', '.join(f'{k}={v}' for k, v in given.items()) or 'the detected cluster'} "
        f"(waiting up to {args.initialization_timeout}s for every process)",
        file=sys.stderr,
        flush=True,
    )
    try:
        jax.distributed.initialize(
            **given,
            initialization_timeout=args.initialization_timeout,
            heartbeat_timeout_seconds=args.heartbeat_timeout,
            shutdown_timeout_seconds=args.heartbeat_timeout,
        )
    except (ValueError, RuntimeError) as e:  # jax's XlaRuntimeError is a RuntimeError
        raise ConfigError(
            f"jax.distributed.initialize({', '.join(f'{k}={v!r}' for k, v in given.items())}) "
            f"failed: {str(e).splitlines()[0]}; give every process the same --coordinator_address "
            "and --num_processes and a distinct --process_id, or --distributed on a cluster"
        ) from None


def is_lead() -> bool:
    """True in the process that writes the run's files (config, tokenizer, logs, plots): process 0."""
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Waits until every process gets here (no-op with one process)."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def run_mesh(mesh_config) -> Mesh:
    """The (data, fsdp, tensor) mesh of `config.mesh` over the run's devices. One process may use fewer devices
    than it sees (its first ones: the default all-1 mesh trains on one device); several processes must use all."""
    shape = (mesh_config.data, mesh_config.fsdp, mesh_config.tensor)
    if min(shape) < 1:
        raise ConfigError(f"config.mesh (data, fsdp, tensor) = {shape}: every size must be a positive integer")
    devices = jax.devices()
    if jax.process_count() == 1:
        devices = devices[: math.prod(shape)]
    try:
        return make_mesh(*shape, devices=devices)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def fitting_mesh(mesh_config) -> Mesh:
    """A reader's mesh (eval): the run's own when the devices present can hold it, else the first device, with a
    note; a checkpoint restores under any mesh, so a workdir trained on 8 devices reads on a laptop as it is."""
    shape = (mesh_config.data, mesh_config.fsdp, mesh_config.tensor)
    present = len(jax.devices())
    if jax.process_count() > 1 or math.prod(shape) <= present:
        return run_mesh(mesh_config)
    print(
        f"note: the run's mesh (data, fsdp, tensor) = {shape} needs {math.prod(shape)} devices and {present} are "
        "present: reading it on one device (--config.mesh.* flags choose another mesh)",
        file=sys.stderr,
        flush=True,
    )
    return first_device_mesh()


def first_device_mesh() -> Mesh:
    """The one-device mesh that code given no mesh runs on (jax.devices()[0], as unsharded jax code would)."""
    return make_mesh(devices=jax.devices()[:1])


class InFlight:
    """Keeps at most `limit` dispatched steps unfinished: `add(outputs)` waits for the oldest beyond that.

    XLA:CPU queues at most 32 computations per device; with more dispatched ahead, steps whose collectives span
    several devices of one process deadlock (measured, jax 0.10.2 on 2 cores: a (8,1,1) mesh of simulated devices
    with 100 train steps in flight, or 2 processes x 2 devices with 33 eval steps in flight, hang for good; 31 do
    not). Eight steps ahead keep one device or an accelerator just as busy.
    """

    def __init__(self, limit: int = 8):
        self.limit, self.queue = limit, collections.deque()

    def add(self, outputs):
        self.queue.append(outputs)
        if len(self.queue) > self.limit:
            jax.block_until_ready(self.queue.popleft())
        return outputs
