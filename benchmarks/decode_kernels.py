"""A/B of each decoding specialisation of txjax.decode.kernels against the model's own cached decoding.

    python benchmarks/decode_kernels.py [--shape=gpt2_small] [--dtype=float32] [--rows=1] [--position=256]
        [--rounds=5] [--out=results/decode_kernels_SHAPE_DTYPE_rowsN_PLATFORM.json]

One process, variants interleaved round by round (the same machine load for each): ms per decode step (a jitted
lax.fori_loop of 32 steps, cache of `position` slots, the last 32 written) for
- model: the model's own methods on its trained parameters (layers unrolled), its [B, S, KV, K] cache (Flax wmt's
  decode=True);
- cache: the kernels' cache layout and writes on the trained parameters (fused and out_major off);
- fused: + W^Q|W^K|W^V and SwiGLU's W1|W3 as one product each;
- kernels: + out-major kernels (what txjax.decode runs for `rows` = 1 on a CPU: for_decoding's parameters).
Each figure is the median over rounds of the wall time; the JSON result records the CPU and the command.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import statistics
import time

import common
import flax.linen as nn
import jax
import jax.numpy as jnp
from decode import SHAPES

from txjax.decode import kernels
from txjax.decode.cache import empty_cache
from txjax.model import kv_cache
from txjax.model.models import DecoderLM

STEPS = 32


def step_loop(model, params, rows, position, decoding: bool):
    """A jitted function: 32 decode steps at positions position-32.. on a cache of `position` slots -> ms/step."""
    context = kernels.installed if decoding else contextlib.nullcontext
    with context():
        shapes = jax.eval_shape(lambda: empty_cache(model, rows, position))

    def empty(path, s):
        if path[-1].key == kv_cache.POSITIONS:  # the first position - 32 slots filled
            return jnp.where(jnp.arange(position) < position - STEPS, jnp.arange(position), -1) * jnp.ones(
                s.shape, s.dtype
            )
        if path[-1].key == kv_cache.INDEX:
            return jnp.full(s.shape, position - STEPS, s.dtype)
        return jnp.zeros(s.shape, s.dtype)

    cache = jax.tree_util.tree_map_with_path(empty, shapes)

    @jax.jit
    def run(params, cache):
        def body(i, carry):
            cache, token = carry
            pos = jnp.full((rows, 1), position - STEPS + i)
            with context():
                logits, mutated = model.apply(
                    {"params": params, "cache": cache}, token, pos, decode=True, mutable=["cache"]
                )
            return mutated["cache"], jnp.argmax(logits[:, -1:], -1).astype(jnp.int32)

        return jax.lax.fori_loop(0, STEPS, body, (cache, jnp.zeros((rows, 1), jnp.int32)))[1]

    run(params, cache).block_until_ready()

    def timed():
        start = time.perf_counter()
        run(params, cache).block_until_ready()
        return (time.perf_counter() - start) / STEPS * 1e3

    return timed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=tuple(SHAPES), default="gpt2_small")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--position", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out")
    args = parser.parse_args()
    cfg = dataclasses.replace(SHAPES[args.shape], dtype=args.dtype, scan_layers=False, max_len=max(1024, args.position))
    model = DecoderLM(cfg)
    init = jax.jit(lambda key: nn.meta.unbox(model.init(key, jnp.zeros((1, 1), jnp.int32))["params"]))
    params = jax.tree_util.tree_map(lambda p: p.astype(args.dtype), init(jax.random.key(0)))
    out_major = args.rows == 1 and jax.default_backend() == "cpu"
    variants = {
        "model": step_loop(model, params, args.rows, args.position, False),
        "cache": step_loop(model, params, args.rows, args.position, True),
        "fused": step_loop(model, kernels.decoding_params(params, out_major=False), args.rows, args.position, True),
        "kernels": step_loop(
            model, kernels.decoding_params(params, out_major=out_major), args.rows, args.position, True
        ),
    }
    times = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, timed in variants.items():
            times[name].append(timed())
    ms = {name: round(statistics.median(t), 3) for name, t in times.items()}
    for name, value in ms.items():
        print(f"{name:8s} {value:8.3f} ms/step  ({ms['model'] / value:.2f}x the model's own)")
    result = {"ms_per_step": ms, "shape": args.shape, "dtype": args.dtype, "rows": args.rows}
    result |= {"position": args.position, "out_major": out_major}
    common.warn_if_loaded()
    common.save(f"decode_kernels_{args.shape}_{args.dtype}_rows{args.rows}", result, args.out)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
