"""Ahead of time: a run's jitted train step (or eval step) lowered and compiled for devices that need not be here
(a TPU topology's, txjax.parallel.topology), and what XLA says of it: HBM per chip, FLOPs, collectives, its estimate
of the step's time. `run.py compile` prints it.

The step is the one `run.py train` jits (txjax.training.step.make_train_step, on the mesh config.mesh makes of the
devices), given jax.ShapeDtypeStructs that carry their shardings: the state's shapes from jax.eval_shape and a batch
of the run's own data (the first batch's shapes), so nothing of the model's size is allocated.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import numpy as np

from txjax import families
from txjax.errors import ConfigError
from txjax.evaluate.split import make_eval_step
from txjax.families.objective import params_shardings
from txjax.ops import hlo
from txjax.ops.summary import train_flops_per_batch
from txjax.parallel.distributed import run_mesh
from txjax.parallel.sharding import batch_sharding
from txjax.state.train_state import init_state, optimizer, state_shardings
from txjax.training.edge import RunSpec
from txjax.training.step import make_train_step

ESTIMATE = "XLA's estimate (cost_analysis optimal_seconds), not a measurement"


class Program(NamedTuple):
    """A step compiled for a mesh, with what it was compiled from."""

    compiled: jax.stages.Compiled
    mesh: jax.sharding.Mesh
    inputs: tuple  # the abstract arguments: (state, batch) or (params, batch)
    model_flops: int  # the model FLOPs of one step over every device (summary.train_flops_per_batch; eval: 1/3)
    tokens: int  # the batch's positions (every row's target length): tokens per step
    params: int  # the model's parameters


def abstract(shapes, shardings):
    """ShapeDtypeStructs of `shapes` (a tree of them) carrying `shardings` (a tree of the same structure)."""
    return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings)


def compile_step(spec: RunSpec, first_batch: dict, devices: list, step: str = "train", num_slices: int = 1) -> Program:
    """The run's `step` compiled for `devices` (config.mesh over all of them; with num_slices > 1 the data axis
    across the slices), its batch shaped as `first_batch` (the run's data's first batch)."""
    if spec.mesh.data % num_slices:
        raise ConfigError(
            f"--num_slices={num_slices}: the data axis spans the slices; set --config.mesh.data to a multiple of "
            f"{num_slices} (it is {spec.mesh.data})"
        )
    model, t = families.build(spec.family, spec.model), spec.train
    mesh = run_mesh(spec.mesh, devices)
    batch = abstract(
        {k: jax.ShapeDtypeStruct(np.shape(v), np.asarray(v).dtype) for k, v in first_batch.items()},
        {k: batch_sharding(mesh) for k in first_batch},
    )
    flops = train_flops_per_batch(model.cfg, spec.family, first_batch)
    if step == "train":
        tx = optimizer(model, t.optim, t.lora)
        init = functools.partial(init_state, model, tx, t.seed, lora_config=t.lora)
        state = abstract(jax.eval_shape(init), state_shardings(model, tx, t.seed, mesh, t.lora))
        inputs, fn = (state, batch), make_train_step(model, tx, t, mesh)
    else:  # the forward pass alone: a third of a training step's FLOPs
        params = jax.eval_shape(functools.partial(families.init_params, model, jax.random.key(0)))
        inputs, fn, flops = (
            (abstract(params, params_shardings(model, mesh)), batch),
            make_eval_step(model, mesh),
            flops // 3,
        )
    b, s, l = families.batch_lengths(families.get(spec.family), first_batch)
    params = inputs[0].params if step == "train" else inputs[0]
    count = sum(math.prod(x.shape) for x in jax.tree.leaves(params))
    return Program(fn.lower(*inputs).compile(), mesh, inputs, flops, b * (s + l), count)


def report(program: Program, chip_hbm_bytes: int, chip_bf16_flops: float) -> dict:
    """The compiled step's figures per chip: HBM (and whether it fits `chip_hbm_bytes`), XLA's FLOPs, collectives
    (across slices apart), XLA's estimated step time and what it makes of MFU and tokens per second.

    XLA's cost analysis counts a while loop's body once (scanned layers: one layer), and gives a negative time for
    some programs (reported as None): where the program loops, xla_counts_loop_bodies_once says its FLOPs and time
    are too low (model.scan_layers=false unrolls the layers)."""
    chips, text = program.mesh.devices.size, program.compiled.as_text()
    memory, cost = hlo.memory_per_device(program.compiled), hlo.cost(program.compiled)
    seconds = cost.get("optimal_seconds")
    seconds = seconds if seconds and seconds > 0 else None  # XLA's cost model gives a negative time where it fails
    return {
        "chips": chips,
        "mesh": dict(program.mesh.shape),
        "params": program.params,
        "tokens_per_step": program.tokens,
        "fits": memory["total"] <= chip_hbm_bytes,
        "chip_hbm_bytes": chip_hbm_bytes,
        "hbm_per_chip_bytes": memory,
        "flops_per_step": cost.get("flops"),
        "model_flops_per_step": program.model_flops,
        "collectives": hlo.collectives(text, chips),
        "xla_counts_loop_bodies_once": hlo.has_loops(text),
        "estimated_step_seconds": seconds,
        "estimated_mfu": program.model_flops / (chips * chip_bf16_flops * seconds) if seconds else None,
        "tokens_per_second_estimate": program.tokens / seconds if seconds else None,
        "estimates": ESTIMATE,
    }
