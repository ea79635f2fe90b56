"""Throughput of K runs trained together (jax.vmap over stacked train states) against the same K runs one by one.

    python benchmarks/vmap_sweep.py [--steps=20] [--ks=4,8] [--experiment=experiments/shakespeare_char.py]

The runs are the experiment's shape (default shakespeare_char: 4 layers, 4 heads, d_model 128, context 64,
batch 12) with different seeds and learning rates, on random tokens (no data file needed). Both ways use the same
train_step function (txjax.train.train_step_function); timings exclude compilation (one warm-up step each).
Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from txjax import config as config_lib
from txjax.experiment import build_model
from txjax.multirun import stack
from txjax.train import train_step_function
from txjax.train_state import init_state, make_optimizer, run_keys


def random_batch(rng, batch_size: int, seq_len: int, vocab: int) -> dict:
    tokens = rng.integers(0, vocab, (batch_size, seq_len + 1), dtype=np.int32)
    ones = np.ones((batch_size, seq_len), np.int32)
    return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "weights": ones.astype(np.float32),
            "positions": np.broadcast_to(np.arange(seq_len, dtype=np.int32), (batch_size, seq_len)).copy(),
            "segment_ids": ones}


def timed(step, state, batches, keys) -> float:
    """Seconds per call of step over the batches, after one warm-up call (compilation)."""
    state, metrics = step(state, batches[0], keys)
    jax.block_until_ready(metrics)
    began = time.perf_counter()
    for batch in batches[1:]:
        state, metrics = step(state, batch, keys)
    jax.block_until_ready((state, metrics))
    return (time.perf_counter() - began) / (len(batches) - 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", default=str(config_lib.REPO / "experiments" / "shakespeare_char.py"))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--ks", default="4,8")
    args = parser.parse_args()
    config = config_lib.load_config(args.experiment)
    config.model.update(vocab_size=65, max_len=config.data.seq_len)
    t, B, L = config.train, config.train.batch_size, config.data.seq_len
    model = build_model(config)
    train_step = train_step_function(model, make_optimizer(t), t)
    rng = np.random.default_rng(0)
    one_step = jax.jit(train_step, donate_argnums=0)
    many_steps = jax.jit(jax.vmap(train_step), donate_argnums=0)
    results = {}
    print(f"{'K':>3} {'sequential tok/s':>17} {'vmapped tok/s':>14} {'speed-up':>9}")
    for k in [int(x) for x in args.ks.split(",")]:
        configs = [config.train.copy_and_resolve_references() for _ in range(k)]
        for i, c in enumerate(configs):
            c.update(seed=i, learning_rate=t.learning_rate * (1 + i / k))
        states = [jax.jit(lambda c=c: init_state(model, make_optimizer(c), c.seed))() for c in configs]
        keys = [run_keys(c.seed)[1] for c in configs]
        batches = [[jax.device_put(random_batch(rng, B, L, 65)) for _ in range(args.steps + 1)] for _ in configs]
        stacked_states = stack(states)  # before the sequential runs donate the states' buffers
        stacked_batches = [stack([b[i] for b in batches]) for i in range(args.steps + 1)]
        sequential = sum(timed(one_step, s, b, key) for s, b, key in zip(states, batches, keys))  # s per K steps
        vmapped = timed(many_steps, stacked_states, stacked_batches, jnp.stack(keys))
        r = results[f"k{k}"] = {"sequential_tokens_per_s": k * B * L / sequential,
                                "vmapped_tokens_per_s": k * B * L / vmapped, "speedup": sequential / vmapped}
        print(f"{k:>3} {r['sequential_tokens_per_s']:>17,.0f} {r['vmapped_tokens_per_s']:>14,.0f} "
              f"{r['speedup']:>8.2f}x")
    print(json.dumps({"benchmark": "vmap_sweep", "shape": f"{config.model.num_layers}L/{config.model.num_heads}H/"
                      f"d{config.model.d_model}/ctx{L}/batch{B}", "steps": args.steps, **results}))


if __name__ == "__main__":
    main()
