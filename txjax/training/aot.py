"""Ahead of time: a run's jitted train step (or eval step, or decoding step) lowered and compiled for devices that
need not be here (a TPU topology's, txjax.parallel.topology), and what XLA says of it: HBM per chip, FLOPs,
collectives, its estimate of the step's time. `run.py compile` prints it.

The step is the one `run.py train` jits (txjax.training.step.make_train_step, on the mesh config.mesh makes of the
devices), given jax.ShapeDtypeStructs that carry their shardings: the state's shapes from jax.eval_shape and a batch
of the run's own data (the first batch's shapes), so nothing of the model's size is allocated. The decoding step is
the one generation runs (txjax.decode.search.decode_steps: cached feed-and-choose in a while loop, whose body XLA's
cost analysis counts once: one step), for train.batch_size prompts (times the strategy's rows per prompt) of
config.decode's strategy, its KV cache of the model's whole context (max_len slots) split by rows over the mesh's
batch axes, the parameters in decoding's layout (txjax.decode.cache.for_decoding) as XLA lays that rearrangement
out from the training shards.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from txjax import families
from txjax.decode import search
from txjax.decode.cache import ROW_LEAVES, for_decoding, grow
from txjax.decode.strategy import Strategy
from txjax.decode.workdir import strategy_from_config
from txjax.errors import ConfigError
from txjax.evaluate.split import make_eval_step
from txjax.families.objective import params_shardings
from txjax.ops import hlo
from txjax.ops.summary import train_flops_per_batch
from txjax.parallel.distributed import run_mesh
from txjax.parallel.sharding import BATCH_AXES, batch_sharding
from txjax.state.train_state import init_state, optimizer, state_shardings
from txjax.training.edge import RunSpec
from txjax.training.step import make_train_step

ESTIMATE = "XLA's estimate (cost_analysis optimal_seconds), not a measurement"
STEPS = ("train", "eval", "decode")


class Program(NamedTuple):
    """A step compiled for a mesh, with what it was compiled from."""

    compiled: jax.stages.Compiled
    mesh: jax.sharding.Mesh
    inputs: tuple  # the abstract arguments: (state, batch), (params, batch) or decode_steps' (params, loop, until)
    model_flops: int | None  # the model FLOPs of one step over every device (summary.train_flops_per_batch; eval:
    # 1/3; decoding: None)
    tokens: int  # the batch's positions (every row's target length), or the rows decoded: tokens per step
    params: int  # the model's parameters
    cache_bytes: int | None = None  # decoding: the KV cache's bytes a chip holds (among the arguments)
    step_is_loop: bool = False  # decoding: the step is the body of the entry's while loop (one trip: one step)


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
    if step == "decode":
        return compile_decode(spec, model, mesh)
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


def compile_decode(spec: RunSpec, model, mesh) -> Program:
    """One cached decoding step (module docstring) compiled for `mesh`."""
    strategy = Strategy(**strategy_from_config(spec.decode, None))
    b, length = spec.train.batch_size, model.cfg.max_len
    rows = b * strategy.rows_per_prompt
    shapes = jax.eval_shape(functools.partial(families.init_params, model, jax.random.key(0)))
    decoding = []  # the decoding model for_decoding makes

    def relayout(params):
        decoding_model, params = for_decoding(model, params, rows)
        decoding.append(decoding_model)
        return params

    trained = abstract(shapes, params_shardings(model, mesh))
    laid_out = jax.jit(relayout).lower(trained).compile().output_shardings  # XLA's layout of the rearrangement
    params = abstract(jax.eval_shape(relayout, trained), laid_out)
    _, sources = families.family_of(model).prompts([[1]], None)  # None: a decoder-only model encodes nothing
    int32 = lambda *shape: jax.ShapeDtypeStruct(shape, np.int32)
    source = None if sources is None else (int32(b, length), int32(b))

    def begun(params, prompt_Bx1, lengths_B, source):  # one prompt token a row, the cache grown to the context
        loop = search.begin(decoding[0], params, strategy, 0, prompt_Bx1, lengths_B, source, jax.random.key(0), 1)
        return loop.replace(cache=grow(loop.cache, length))

    shards = math.prod(mesh.shape[a] for a in BATCH_AXES)
    split = lambda path, leaf: getattr(path[-1], "key", None) in ROW_LEAVES and leaf.shape[0] % shards == 0
    place = lambda path, leaf: NamedSharding(mesh, P(BATCH_AXES) if split(path, leaf) else P())
    shapes = jax.eval_shape(begun, params, int32(b, 1), int32(b), source)
    loop = abstract(shapes, jax.tree_util.tree_map_with_path(place, shapes))
    until = jax.ShapeDtypeStruct((), np.int32, sharding=NamedSharding(mesh, P()))
    compiled = search.decode_steps.lower(decoding[0], params, strategy, 0, loop, length, until).compile()
    shard_bytes = lambda x: math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize
    cache_bytes = sum(shard_bytes(x) for x in jax.tree.leaves(loop.cache))
    count = sum(math.prod(x.shape) for x in jax.tree.leaves(trained))
    return Program(compiled, mesh, (params, loop, until), None, rows, count, cache_bytes, step_is_loop=True)


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
        "collectives": hlo.collectives(text, chips, entry_loops_once=program.step_is_loop),
        "xla_counts_loop_bodies_once": hlo.has_loops(text),
        "estimated_step_seconds": seconds,
        "estimated_mfu": program.model_flops / (chips * chip_bf16_flops * seconds)
        if seconds and program.model_flops
        else None,
        "tokens_per_second_estimate": program.tokens / seconds if seconds else None,
        "estimates": ESTIMATE,
    } | ({} if program.cache_bytes is None else {"kv_cache_bytes_per_chip": program.cache_bytes})
