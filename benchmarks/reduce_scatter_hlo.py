"""How XLA's TPU compiler writes FSDP's gradient reduction, topology by topology: a reduce-scatter onto the shards,
or an all-reduce of the whole gradient and a slice of it (issue 63, item 2: the scale table's pods show the latter).

    python benchmarks/reduce_scatter_hlo.py [--topologies=v5e:2x2,v5e:2x4,v5e:4x4,v5p:2x2x1,v5p:2x2x2,...]

Three programs a topology, each over all its chips, compiled for them without them (the tpu extra):
    einsum      one weight's gradient alone, no txjax code: x^T y over rows [64 n, 1024] split over the n chips, its
                result [1024, 1024] laid out by its first axis (jit's out_shardings P('fsdp')): what FSDP's backward
                pass computes for a weight
    psum_scatter  the same product in jax.shard_map, reduced by jax.lax.psum_scatter: a reduce-scatter written out
    train_step  the tiny model's train step as `run.py compile` compiles it (txjax.training.aot), mesh.fsdp = n
and for each the collectives one step runs (txjax.ops.hlo.collectives). Writes results/reduce_scatter_hlo_cpu.json.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # compile-only TPU devices; this host's own jax on its CPU
import common  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from txjax import config as config_lib  # noqa: E402
from txjax.ops import hlo  # noqa: E402
from txjax.parallel.sharding import make_mesh  # noqa: E402
from txjax.parallel.topology import parse_topology, topology_devices  # noqa: E402
from txjax.training import aot  # noqa: E402
from txjax.training.edge import prepare_run  # noqa: E402

TOPOLOGIES = "v5e:2x2,v5e:2x4,v5e:4x4,v5p:2x2x1,v5p:2x2x2,v6e:2x2,v6e:4x4"
TINY = [  # the default experiment (reverse) at a small size whose shards a TPU pads nothing of (tests/test_compile)
    "--config.data.max_digits=4",
    "--config.data.eval_size=20",
    "--config.model.num_layers=2",
    "--config.model.num_heads=4",
    "--config.model.d_model=512",
    "--config.model.d_ff=2048",
    "--config.model.vocab_size=512",
]


def einsum_collectives(devices: list, scatter: bool) -> dict:
    """The einsum program's collectives (scatter: the psum_scatter program's)."""
    n = len(devices)
    mesh = make_mesh(fsdp=n, devices=devices)
    x = jax.ShapeDtypeStruct((64 * n, 1024), jnp.float32, sharding=NamedSharding(mesh, P("fsdp")))
    product = lambda x, y: jnp.einsum("bd,bf->df", x, y)
    if scatter:
        body = lambda x, y: jax.lax.psum_scatter(product(x, y), "fsdp", scatter_dimension=0, tiled=True)
        grad = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("fsdp"), P("fsdp")), out_specs=P("fsdp")))
    else:
        grad = jax.jit(product, out_shardings=NamedSharding(mesh, P("fsdp")))
    return hlo.collectives(grad.lower(x, x).compile().as_text(), n)


def train_step_collectives(devices: list) -> dict:
    n = len(devices)
    overrides = [*TINY, f"--config.train.batch_size={4 * n}", f"--config.mesh.fsdp={n}"]
    with tempfile.TemporaryDirectory() as workdir:
        spec, (_, train_data, _) = prepare_run(config_lib.from_command_line(None, overrides), Path(workdir))
    program = aot.compile_step(spec, train_data.batch(spec.train.seed, 0, spec.train.batch_size), devices)
    return hlo.collectives(program.compiled.as_text(), n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topologies", default=TOPOLOGIES)
    args = parser.parse_args()
    rows = {}
    for name in args.topologies.split(","):
        devices = topology_devices(parse_topology(name))
        row = {"einsum": einsum_collectives(devices, False), "psum_scatter": einsum_collectives(devices, True)}
        rows[name] = {"chips": len(devices), **row, "train_step": train_step_collectives(devices)}
        kinds = lambda c: ", ".join(f"{k} {v['bytes']:,} B" for k, v in c.items() if "count" in v)
        print(f"{name}: " + "; ".join(f"{p} {kinds(c)}" for p, c in rows[name].items() if p != "chips"), flush=True)
    versions = {"jax": jax.__version__, "libtpu": __import__("importlib").metadata.version("libtpu")}
    path = common.save("reduce_scatter_hlo", {"versions": versions, "topologies": rows}, None)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
