"""TPU topologies without the TPU: their chips (HBM, bf16 peak) and compile-only devices from libtpu (the tpu extra).

A topology is named as MaxText and Cloud TPU write them: GENERATION:SHAPE (v4:2x2x2, v5e:4x4, v5p:2x2x1, v6e:16x16;
the shape in chips) or an accelerator type (v5e-256, v5litepod-16, v6e-256 count chips; v4-8, v5p-128 count
TensorCores, two a chip). `topology_devices` returns the devices of `num_slices` such slices, slice by slice, from
jax.experimental.topologies.get_topology_desc: jit can lower and compile for them on any host with libtpu installed
(nothing runs; txjax.training.aot), as MaxText's train_compile.py does.
"""

from __future__ import annotations

import math
import os
import re
from typing import NamedTuple

from txjax.errors import ConfigError
from txjax.extras import require

GiB = 2**30


class Chip(NamedTuple):
    """One TPU generation's chip: what a compiled program is checked against and its MFU's denominator."""

    hbm_bytes: int
    bf16_flops: float  # peak bf16 FLOP/s of one chip (Cloud TPU's published figure)
    dims: int  # the torus's dimensions: 2 (v5e, v6e) or 3 (v4, v5p)
    cores_per_name: int  # TensorCores per chip counted by the accelerator type's number (v4-8: 4 chips)
    chip_config: str  # get_topology_desc's chip_config_name: one device per chip


CHIPS = {  # cloud.google.com/tpu/docs/system-architecture-tpu-vm, per chip
    "v4": Chip(32 * GiB, 275e12, 3, 2, "megacore"),
    "v5e": Chip(16 * GiB, 197e12, 2, 1, "default"),
    "v5p": Chip(95 * GiB, 459e12, 3, 2, "default"),
    "v6e": Chip(32 * GiB, 918e12, 2, 1, "default"),
}
ALIASES = {"v5litepod": "v5e"}  # Cloud TPU's accelerator type of v5e


class Topology(NamedTuple):
    generation: str  # a key of CHIPS
    shape: tuple[int, ...]  # chips along each torus dimension

    @property
    def name(self) -> str:
        return f"{self.generation}:{'x'.join(map(str, self.shape))}"

    @property
    def chips(self) -> int:
        return math.prod(self.shape)

    @property
    def chip(self) -> Chip:
        return CHIPS[self.generation]


def parse_topology(name: str) -> Topology:
    """GENERATION:SHAPE or an accelerator type (module docstring); ConfigError naming the accepted forms."""
    advice = (
        f"--topology={name!r}: expected GENERATION:SHAPE (v5e:4x4, v5p:2x2x2, v4:2x2x2, v6e:8x8) or an accelerator "
        f"type (v5e-256, v5p-128, v6e-256, v4-8); generations: {', '.join(CHIPS)}"
    )
    if found := re.fullmatch(r"(v\w+?):(\d+(?:x\d+)*)", name):
        generation, shape = ALIASES.get(found[1], found[1]), tuple(int(n) for n in found[2].split("x"))
        if generation in CHIPS and len(shape) == CHIPS[generation].dims and min(shape) >= 1:
            return Topology(generation, shape)
    if found := re.fullmatch(r"(v\w+?)-(\d+)", name):
        generation = ALIASES.get(found[1], found[1])
        if generation in CHIPS and int(found[2]) % CHIPS[generation].cores_per_name == 0:
            return Topology(generation, _torus(int(found[2]) // CHIPS[generation].cores_per_name, generation))
    raise ConfigError(advice)


def _torus(chips: int, generation: str) -> tuple[int, ...]:
    """The shape Cloud TPU gives `chips` chips: powers of two as even as they go, smallest first, 1s last (v5e-8
    2x4, v5e-256 16x16, v5p-8 2x2x1, v5p-128 4x4x4)."""
    if chips & (chips - 1):
        raise ConfigError(f"{chips} chips: an accelerator type's chips are a power of two; give GENERATION:SHAPE")
    shape = [1] * CHIPS[generation].dims
    while math.prod(shape) < chips:
        shape[shape.index(min(shape))] *= 2
    return tuple(sorted(shape, key=lambda n: (n == 1, n)))


def topology_devices(topology: Topology, num_slices: int = 1) -> list:
    """The compile-only devices of `num_slices` slices of `topology`, slice by slice (a slice's devices together:
    a mesh whose outermost axis is a multiple of num_slices puts that axis across slices, over the data-center
    network), each chip one device."""
    require("libtpu", "compiling for a TPU topology (run.py compile)")
    _quiet_libtpu(topology)
    from jax.experimental import topologies

    chip = topology.chip
    host = (*(min(2, n) for n in topology.shape[:2]), 1)  # (2, 2, 1) chips a host, as MaxText compiles them
    desc = topologies.get_topology_desc(
        platform="tpu",
        topology_name=topology.name,
        chip_config_name=chip.chip_config,
        chips_per_host_bounds=host,
        num_slices=num_slices,
    )
    return sorted(desc.devices, key=lambda d: d.id)  # slice s's ids are (s + 1) * 100000 + i


def _quiet_libtpu(topology: Topology) -> None:
    """Environment read when libtpu loads, set unless the user set it: on a host without TPU chips libtpu asks the
    metadata server for the accelerator type and worker hostnames, finds none and prints five lines of warnings
    about TPU_ACCELERATOR_TYPE / TPU_WORKER_HOSTNAMES; with these given it has nothing to ask (a compile-only
    topology reads neither). ALLOW_MULTIPLE_LIBTPU_LOAD: libtpu takes a lock file (/tmp/libtpu_lockfile) for the
    chips of the host, which another process holding it (a training run, or any jax process where libtpu is
    installed) would refuse; compiling uses no chip."""
    name = "v5litepod" if topology.generation == "v5e" else topology.generation
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", f"{name}-{topology.chips * topology.chip.cores_per_name}")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("TPU_WORKER_ID", "0")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
