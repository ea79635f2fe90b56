"""Throughput of K runs trained together (jax.vmap over stacked train states) against the same K runs one by one.

    python benchmarks/vmap_sweep.py [--calls=10] [--ks=4,8] [--experiment=experiments/shakespeare_char.py]

The runs have the experiment's shape (default shakespeare_char: 4 layers, 4 heads, d_model 128, context 64,
batch 12) and different seeds and learning rates, on random tokens (no data file needed). Both ways use the same
train_step function (txjax.training.step.train_step_function): 'sequential' is one jitted step of each run in turn,
'vmapped' one step of jit(vmap(train_step)) over the K stacked states. Calls are interleaved (common.time_calls),
compilation excluded. Prints a table, writes results/vmap_sweep_PLATFORM.json and ends with one JSON line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import common
import jax
import jax.numpy as jnp
import numpy as np

from txjax import config as config_lib
from txjax.experiment import build_model
from txjax.families import param_roles
from txjax.sections.train import TrainConfig
from txjax.state.optim import make_optimizer
from txjax.state.train_state import init_state, run_keys
from txjax.training.stack import stack
from txjax.training.step import train_step_function

VOCAB = 65


def random_batch(rng, batch_size: int, seq_len: int) -> dict:
    tokens = rng.integers(0, VOCAB, (batch_size, seq_len + 1), dtype=np.int32)
    ones = np.ones((batch_size, seq_len), np.int32)
    return {
        "inputs": tokens[:, :-1],
        "targets": tokens[:, 1:],
        "weights": ones.astype(np.float32),
        "positions": np.broadcast_to(np.arange(seq_len, dtype=np.int32), (batch_size, seq_len)).copy(),
        "segment_ids": ones,
    }


def variants(config, k: int) -> dict:
    """{'sequential': one step of each of the K runs, 'vmapped': one vmapped step of all K}, each a fn()."""
    t = TrainConfig.of(config.train)
    model = build_model(config)
    train_step = train_step_function(model, make_optimizer(t.optim, param_roles(model)), t)
    one_step = jax.jit(train_step, donate_argnums=0)
    all_steps = jax.jit(jax.vmap(train_step), donate_argnums=0)
    runs = [dataclasses.replace(t.optim, learning_rate=t.optim.learning_rate * (1 + i / k)) for i in range(k)]
    states = [
        jax.jit(lambda i=i: init_state(model, make_optimizer(runs[i], param_roles(model)), i))() for i in range(k)
    ]
    keys = [run_keys(i)[1] for i in range(k)]
    rng = np.random.default_rng(0)
    batches = [jax.device_put(random_batch(rng, t.batch_size, config.data.seq_len)) for _ in runs]
    stacked = {"state": stack(states), "batch": stack(batches), "keys": jnp.stack(keys)}

    def sequential():
        for i in range(k):
            states[i], _ = one_step(states[i], batches[i], keys[i])
        return states

    def vmapped():
        stacked["state"], _ = all_steps(stacked["state"], stacked["batch"], stacked["keys"])
        return stacked["state"]

    return {"sequential": sequential, "vmapped": vmapped}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", default=str(config_lib.REPO / "experiments" / "shakespeare_char.py"))
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--ks", default="4,8")
    args = parser.parse_args()
    common.warn_if_loaded()
    config = config_lib.load_config(args.experiment)
    config.model.update(vocab_size=VOCAB, max_len=config.data.seq_len)
    tokens = config.train.batch_size * config.data.seq_len  # per run and step
    rows = []
    for k in [int(x) for x in args.ks.split(",")]:
        timings = common.time_calls(variants(config, k), args.calls, warmup=1, rounds=2)
        row = {"K": k}
        for name, s in timings.items():
            row |= {
                f"{name}_ms": s["median_ms"],
                f"{name}_tokens_per_s": k * tokens / (s["median_ms"] / 1e3),
                f"{name}_cpu_ms": s["cpu_ms"],
            }
        rows.append(row | {"speedup": row["sequential_ms"] / row["vmapped_ms"]})
    print(common.table(rows))
    shape = (
        f"{config.model.num_layers}L/{config.model.num_heads}H/d{config.model.d_model}/ctx{config.data.seq_len}"
        f"/batch{config.train.batch_size}"
    )
    payload = {"benchmark": "vmap_sweep", "shape": shape, "calls": args.calls, "rows": rows}
    common.save("vmap_sweep", payload)
    print(json.dumps({**payload, "load_average_1min": common.machine()["load_average_1min"]}))


if __name__ == "__main__":
    main()
