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

import collections
import math
import sys

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from txjax.errors import ConfigError
from txjax.parallel.sharding import make_mesh


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    detect: bool = False,
    initialization_timeout: int = 300,
    heartbeat_timeout: int = 60,
) -> None:
    """jax.distributed.initialize when any of the first three is given or `detect` is set (then JAX detects what is
    not given from the cluster); call it before anything touches a device. Nothing happens otherwise."""
    named = {"coordinator_address": coordinator_address, "num_processes": num_processes, "process_id": process_id}
    given = {name: value for name, value in named.items() if value is not None}
    if not given and not detect:
        return
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU processes; no effect on GPU/TPU
    print(
        f"jax.distributed: joining {', '.join(f'{k}={v}' for k, v in given.items()) or 'the detected cluster'} "
        f"(waiting up to {initialization_timeout}s for every process)",
        file=sys.stderr,
        flush=True,
    )
    try:
        jax.distributed.initialize(
            **given,
            initialization_timeout=initialization_timeout,
            heartbeat_timeout_seconds=heartbeat_timeout,
            shutdown_timeout_seconds=heartbeat_timeout,
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


def agree(flags: list[bool], sync: bool) -> list[bool]:
    """Wall-clock decisions (a time budget spent, a timed eval due) taken alike in every process: one process's flags
    as they are; with several, process 0's, broadcast at the steps where all of them sync (`sync`), and all False in
    between. Each process reads its own clock, so deciding alone could stop or evaluate one process and leave the
    others waiting in a collective."""
    if jax.process_count() == 1:
        return flags
    if not sync:
        return [False] * len(flags)
    return [bool(v) for v in multihost_utils.broadcast_one_to_all(np.array(flags, np.int32))]


def mesh_shape(mesh_config) -> tuple[int, int, int, int, int]:
    """(data, fsdp, sequence, tensor, expert) of `config.mesh` (sharding.make_mesh's arguments in order)."""
    return mesh_config.data, mesh_config.fsdp, mesh_config.sequence, mesh_config.tensor, mesh_config.expert


def run_mesh(mesh_config, devices: list | None = None) -> Mesh:
    """The (data, fsdp, sequence, tensor, expert) mesh of `config.mesh` over the run's devices. One process may use
    fewer devices than it sees (its first ones: the default all-1 mesh trains on one device); several must use all,
    as must a mesh over given `devices` (a topology's, txjax.parallel.topology: every host of it runs a process)."""
    shape = mesh_shape(mesh_config)
    if min(shape) < 1:
        raise ConfigError(f"config.mesh (data, fsdp, sequence, tensor, expert) = {shape}: every size must be positive")
    if devices is None:
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
    shape = mesh_shape(mesh_config)
    present = len(jax.devices())
    if jax.process_count() > 1 or math.prod(shape) <= present:
        return run_mesh(mesh_config)
    print(
        f"note: the run's mesh (data, fsdp, sequence, tensor, expert) = {shape} needs {math.prod(shape)} devices and "
        f"{present} are present: reading it on one device (--config.mesh.* flags choose another mesh)",
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
    several devices of one process deadlock (a mesh of simulated CPU devices with more than 32 steps in flight
    hangs for good). Eight steps ahead keep one device or an accelerator just as busy.
    """

    def __init__(self, limit: int = 8, on_done=None):
        """on_done(outputs), if given, receives each step's outputs once they are ready (as NumPy), in order."""
        self.limit, self.queue, self.on_done = limit, collections.deque(), on_done

    def add(self, outputs):
        self.queue.append(outputs)
        if len(self.queue) > self.limit:
            self._finish()
        return outputs

    def flush(self) -> None:
        """Waits for every step still in flight."""
        while self.queue:
            self._finish()

    def _finish(self) -> None:
        oldest = jax.block_until_ready(self.queue.popleft())
        if self.on_done is not None:
            self.on_done(jax.device_get(oldest))
