"""`run.py compile`: the train step compiled for TPU topologies on this CPU host (the tpu extra). What XLA reports is
checked against counts made here: argument bytes per chip against the state's and batch's shards, a model too large
for a chip refused in one line, the data axis across two slices all-reduced over their network, the step the one
`run.py train` jits, the same shards on a v5e and a v5p slice (v5e:2x2, v5p:2x2x1), the decoding step's KV cache
against the model's cache shapes, and the estimator's searches.
Where libtpu is not installed those tests skip with one line; the names and the missing extra
are checked everywhere."""

import functools
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import run as run_py
from txjax import config as config_lib
from txjax import families
from txjax.cli.compile import cheapest, largest_from
from txjax.errors import ConfigError
from txjax.ops import hlo
from txjax.parallel.topology import parse_topology, topology_devices
from txjax.state.optim import make_optimizer
from txjax.state.train_state import init_state, state_shardings
from txjax.training import aot, run, step
from txjax.training.edge import prepare_run

REPO = Path(__file__).parents[1]
TINY = [  # the default experiment (reverse) at toy size
    "--config.data.max_digits=4",
    "--config.data.eval_size=20",
    "--config.model.num_layers=2",
    "--config.model.num_heads=4",
    "--config.model.d_model=64",
    "--config.model.d_ff=128",
    "--config.train.batch_size=16",
]
# a TPU pads an array's last two dimensions to its (8, 128) tiles: shards of 128 columns pad nothing (but vectors')
WIDE = ["--config.model.d_model=512", "--config.model.d_ff=512", "--config.model.vocab_size=512"]
needs_libtpu = pytest.mark.skipif(
    __import__("importlib").util.find_spec("libtpu") is None,
    reason="libtpu is not installed (pip install -e '.[tpu]'): no TPU topology to compile for",
)


@pytest.mark.parametrize(
    "name, shape",
    [("v5e:4x4", (4, 4)), ("v5e-256", (16, 16)), ("v5litepod-8", (2, 4)), ("v6e-256", (16, 16))]
    + [("v5p-128", (4, 4, 4)), ("v5p-8", (2, 2, 1)), ("v4-8", (2, 2, 1)), ("v4:2x2x2", (2, 2, 2))],
)
def test_topology_names_as_cloud_tpu_writes_them(name, shape):
    assert parse_topology(name).shape == shape  # accelerator types: v5e/v6e count chips, v4/v5p TensorCores


@pytest.mark.parametrize("name", ["v5e:2x2x2", "v7:2x2", "v5e-12", "tpu"])
def test_a_topology_name_that_is_none_is_one_line(name):
    with pytest.raises(ConfigError) as e:
        parse_topology(name)
    assert "\n" not in str(e.value) and ("GENERATION:SHAPE" in str(e.value))


def run_compile(capsys, *args) -> subprocess.CompletedProcess:
    """`run.py compile ARGS` in this process (run.py's main: its exit status and one-line errors), its output
    captured; the tests whose compiles this process shares need no process of their own."""
    capsys.readouterr()  # what the test printed before
    try:
        status = run_py.main(["compile", *args])
    except SystemExit as e:  # a step that does not fit: compile's own exit status
        status = e.code
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, status, out, err)


def test_without_libtpu_the_command_names_the_extra(tmp_path):
    # a process of its own: this one imported libtpu's compile-only devices already
    (tmp_path / "libtpu.py").write_text("raise ModuleNotFoundError('no libtpu here', name='libtpu')\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    command = [sys.executable, str(REPO / "run.py"), "compile", "--topology=v5e:2x2", "--config.mesh.data=4"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env, timeout=900)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (
        "error: compiling for a TPU topology (run.py compile) needs the 'libtpu' package (the tpu extra): "
        "pip install -e '.[tpu]'\n"
    )


def compiled(topology: str, overrides: list[str], tmp_path, num_slices: int = 1, step: str = "train"):
    config = config_lib.from_command_line(None, TINY + overrides)
    spec, (_, train_data, _) = prepare_run(config, tmp_path)
    first = train_data.batch(spec.train.seed, 0, spec.train.batch_size)
    devices = topology_devices(parse_topology(topology), num_slices)
    return spec, aot.compile_step(spec, first, devices, step, num_slices)


@pytest.fixture(scope="module")
def fsdp_program(tmp_path_factory):
    """The tiny model's train step for v5e:2x2, its state sharded over 4 chips (fsdp), with the builder of the step
    `run.py train` jits watched: (spec, program, the models train_step_function built a step for)."""
    built = []

    def watched(model, tx, t):
        built.append(model)
        return original(model, tx, t)

    original = step.train_step_function
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(step, "train_step_function", watched)
        spec, program = compiled("v5e:2x2", ["--config.mesh.fsdp=4", *WIDE], tmp_path_factory.mktemp("fsdp"))
    return spec, program, built


@needs_libtpu
def test_argument_bytes_per_chip_are_the_state_and_batch_shards(fsdp_program):
    spec, program, _ = fsdp_program
    model = families.build(spec.family, spec.model)
    tx = make_optimizer(spec.train.optim, families.param_roles(model), model.cfg)
    state = jax.eval_shape(functools.partial(init_state, model, tx, spec.train.seed))
    shardings = state_shardings(model, tx, spec.train.seed, program.mesh)
    shard = lambda s, sharding: math.prod(sharding.shard_shape(s.shape)) * s.dtype.itemsize
    state_bytes = sum(jax.tree.leaves(jax.tree.map(shard, state, shardings)))
    whole = sum(math.prod(s.shape) * s.dtype.itemsize for s in jax.tree.leaves(state))
    batch = program.inputs[1]
    batch_bytes = sum(math.prod(s.sharding.shard_shape(s.shape)) * s.dtype.itemsize for s in batch.values())
    assert state_bytes < whole / 3  # fsdp=4 shards the parameters and moments: most bytes are a quarter
    reported = aot.report(program, 16 * 2**30, 197e12)
    assert reported["hbm_per_chip_bytes"]["arguments"] == pytest.approx(state_bytes + batch_bytes, rel=0.01)
    assert reported["fits"] and reported["chips"] == 4 and reported["mesh"]["fsdp"] == 4
    assert reported["flops_per_step"] > 0 and reported["xla_counts_loop_bodies_once"]  # the scanned layers
    collectives = reported["collectives"]  # FSDP's: each layer's weights gathered (forward, backward), gradients
    assert collectives["all-gather"]["count"] >= 2 * 2 and collectives["reduce-scatter"]["count"] >= 2  # scattered


@needs_libtpu
def test_fsdp_reduce_scatters_each_gradient_onto_its_shards(fsdp_program):
    # on a v5e:2x2; on 16 chips of a v5e:4x4 (v5p:2x2x2, v6e:4x4) XLA writes the same reduction, and any explicit
    # reduce-scatter (psum_scatter), as an all-reduce and a slice: benchmarks/reduce_scatter_hlo.py
    _, program, _ = fsdp_program
    params = program.inputs[0].params
    whole = sum(math.prod(p.shape) * p.dtype.itemsize for p in jax.tree.leaves(params))
    shards = sum(math.prod(p.sharding.shard_shape(p.shape)) * p.dtype.itemsize for p in jax.tree.leaves(params))
    collectives = aot.report(program, 16 * 2**30, 197e12)["collectives"]
    assert collectives["reduce-scatter"]["bytes"] == pytest.approx(shards, rel=0.01)  # each chip's float32 shard
    assert collectives["all-reduce"]["bytes"] < whole / 100  # none of the gradients reduced whole


@needs_libtpu
def test_the_compiled_step_is_the_one_run_py_train_jits(fsdp_program):
    _, program, built = fsdp_program
    assert len(built) == 1  # aot built its step through train_step_function, inside make_train_step ...
    assert run.make_train_step is aot.make_train_step is step.make_train_step  # ... which Run.compile jits


@needs_libtpu
def test_two_slices_put_the_data_axis_across_them(tmp_path):
    _, program = compiled("v5e:2x2", ["--config.mesh.data=2", "--config.mesh.fsdp=4"], tmp_path, num_slices=2)
    reported = aot.report(program, 16 * 2**30, 197e12)
    assert reported["chips"] == 8
    across = reported["collectives"]["across_slices"]
    assert across.get("all-reduce", {}).get("count", 0) > 0  # the gradients' mean over data, over the network
    assert "all-gather" not in across  # fsdp's gathers stay within a slice


@needs_libtpu
def test_a_model_too_large_for_a_chip_is_refused_in_one_line(capsys):
    big = ["--config.model.num_layers=1", "--config.model.d_model=1024", "--config.model.vocab_size=1000000"]
    done = run_compile(capsys, "--topology=v5e:1x1", *TINY, *big)
    assert done.returncode == 1, done.stderr
    assert '"fits": false' in done.stdout
    line = done.stderr.removeprefix("error: ")
    assert done.stderr.count("\n") == 1 and line.startswith("the train step needs ")
    assert "16 GiB of a v5e chip" in line and "--config.model.remat" in line and "batch_size (now 16)" in line


@needs_libtpu
def test_the_decode_step_holds_its_rows_kv_cache_among_its_arguments(tmp_path):
    # a cache of 512 slots larger than a chip's quarter of the parameters; K = 128: a TPU pads none of its tiles
    shape = ["--config.model.d_model=256", "--config.model.num_heads=2", "--config.model.num_kv_heads=1"]
    shape += ["--config.model.d_ff=512", "--config.model.max_len=512", "--config.decode.method=greedy"]
    spec, program = compiled("v5e:2x2", ["--config.mesh.fsdp=4", *shape], tmp_path, step="decode")
    cfg, rows = spec.model, spec.train.batch_size // 4  # greedy: a row a prompt, the rows split over 4 chips
    kv = 2 * rows * cfg.kv_heads * cfg.head_dim * cfg.max_len * jnp.dtype(cfg.compute_dtype).itemsize
    cache = cfg.num_layers * (kv + rows * cfg.max_len * 4 + 4)  # keys and values, each slot's position, the index
    params = sum(math.prod(s.shape) * 4 for s in jax.tree.leaves(program.inputs[0]))
    reported = aot.report(program, 16 * 2**30, 197e12)
    assert reported["kv_cache_bytes_per_chip"] == cache and cache > params / 4
    assert cache + params / 4 <= reported["hbm_per_chip_bytes"]["arguments"] <= cache + params + 2**16
    assert reported["tokens_per_step"] == spec.train.batch_size and reported["xla_counts_loop_bodies_once"]
    moved = sum(c["bytes"] for c in reported["collectives"].values())
    assert 0 < moved < params  # one step's: each weight gathered at most once, not once a slot of the cache


def test_a_step_that_is_none_is_one_line(capsys):
    done = run_compile(capsys, "--topology=v5e:2x2", "--step=bogus")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == "error: --step=bogus is not a step: choose one of train, eval, decode\n"


@pytest.mark.parametrize("start", [1, 3, 16, 5000])
@pytest.mark.parametrize("limit", [0, 1, 11, 16, 1000])
def test_the_batch_search_gallops_from_the_config_then_bisects_to_the_largest_that_fits(limit, start):
    tried = []
    fits = lambda n: tried.append(n) or n <= limit  # monotonic, as a step's bytes grow with its batch
    assert largest_from(fits, start) == limit
    assert len(tried) == len(set(tried))  # no trial compiled twice
    assert len(tried) <= 2 * (max(start, limit).bit_length() + 1)  # doubling or halving, then one octave bisected


@needs_libtpu
def test_the_batch_search_prints_its_trials_and_answers_the_largest_that_fits(capsys):
    # one row of 514 positions over 3M logits is ~3 GB of temporaries: 2 rows fit a v5e chip's 16 GiB, 3 do not.
    # The search starts at the answer (2): its one compile that fits (the slow one) and the refusals of 4, then 3
    huge = ["--config.data.max_digits=256", "--config.model.d_model=16", "--config.model.d_ff=32"]
    huge += ["--config.model.num_heads=2", "--config.model.vocab_size=3000000", "--config.train.batch_size=2"]
    done = run_compile(capsys, "--topology=v5e:1x1", "--search=batch", *TINY, *huge)
    assert done.returncode == 0, done.stderr
    *trials, answer = [json.loads(line) for line in done.stdout.splitlines()]
    sizes = {t["batch_size"]: t["fits"] for t in trials}
    assert trials[0]["batch_size"] == 2 and len(sizes) == len(trials)  # from the config's batch, each size once
    assert all(t["fits"] == ((t["hbm_per_chip_bytes"] or math.inf) <= 16 * 2**30) for t in trials)
    assert all(sizes[a] >= sizes[b] for a in sizes for b in sizes if a < b)  # what fits is monotonic in the batch
    best = max(n for n, fits in sizes.items() if fits)
    assert sizes.get(best + 1) is False  # the next batch was tried and does not fit
    assert answer["search"] == "batch" and answer["fits"] and answer["batch_size"] == best
    assert answer["tokens_per_step"] == best * 514


def test_the_remat_search_takes_the_cheapest_policy_that_fits():
    trial = lambda fits, flops, seconds: {"fits": fits, "flops_per_step": flops, "estimated_step_seconds": seconds}
    trials = {"none": trial(False, 1.0, None), "dots_saveable": trial(True, 1.2, 0.5), "full": trial(True, 1.4, 0.4)}
    assert cheapest(trials) == "full"  # XLA's estimated time decides where every fitting trial has one
    trials["full"]["estimated_step_seconds"] = None  # else recomputation's FLOPs
    assert cheapest(trials) == "dots_saveable"
    assert cheapest({"none": trial(False, 1.0, 0.1)}) is None


@needs_libtpu
def test_a_v5p_slice_holds_the_same_shards_as_a_v5e_slice(fsdp_program, tmp_path):
    _, v5e, _ = fsdp_program
    _, v5p = compiled("v5p:2x2x1", ["--config.mesh.fsdp=4", *WIDE], tmp_path)
    reported = aot.report(v5p, 95 * 2**30, 459e12)
    assert reported["chips"] == 4 and reported["fits"]  # 4 chips of 3-D torus, each one device
    arguments = lambda p: hlo.memory_per_device(p.compiled)["arguments"]
    assert arguments(v5p) == pytest.approx(arguments(v5e), rel=0.01)  # the same state and batch shards a chip
