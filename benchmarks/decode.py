"""Decoding speed: KV-cached generation (txjax.decode) versus recomputing the whole prefix for every new token.

    python benchmarks/decode.py --shape=shakespeare_char|gpt2_small [--dtype=float32|bfloat16] [--repeats=N]
        [--lengths=64,256,1024] [--recompute_budget_s=S] [--model.FIELD=V ...] [--out=PATH]

Greedy, batch 1, a 1-token prompt, no stop token (every run generates exactly N tokens), random weights.
- cached: `txjax.decode.generate_ids`, prefill + compiled lax.while_loops for all N tokens (no host round trip
  per token), the cache growing through bucketed lengths; tokens/s = N / median wall time of `repeats` runs after
  a compiling warm-up. "capacity": the same with one cache of the whole capacity (N slots) from the start.
- recompute: no cache; each token runs the full forward pass over the sequence so far, padded up to the next
  multiple of 64 (static shapes: one compilation per multiple, done before timing), steps in a jitted fori_loop
  per multiple. The estimate (the measured time of one step at each multiple, summed over the tokens) is always
  computed; the whole generation is timed when the estimate is within --recompute_budget_s, else the estimate is
  reported (marked "est").
- per-token cost at position p: cached, one decode step with p tokens in a cache of p slots (a jitted loop of 32
  steps at positions p-32..p-1, divided by 32); recompute, one forward pass over p tokens.
- parameters and KV-cache bytes per token: `run.py inspect`'s (txjax.ops.summary: the keys and values, or MLA's latent
  and RoPE key, that one token adds to a row's cache, every layer; read from the cache's own shapes).
--model.FIELD=V changes the shape's ModelConfig (e.g. --model.num_kv_heads=2, --model.attention=mla).
The last line is JSON for N = 256: cached_tokens_per_s, recompute_tokens_per_s, cost_ratio_1024_vs_64 (cached).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import statistics
import time

import common
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from txjax import config as config_lib
from txjax import decode
from txjax.convert.gpt2 import GPT2_SMALL
from txjax.decode import init_cache
from txjax.model.config import ModelConfig
from txjax.model.models import DecoderLM
from txjax.ops.summary import summarize

SHAPES = {
    # nanoGPT's shakespeare_char model, with a context long enough for 1024 new tokens
    "shakespeare_char": ModelConfig(vocab_size=65, d_model=128, num_heads=4, d_ff=512, num_layers=4, max_len=1024),
    # GPT-2 small (124M parameters)
    "gpt2_small": GPT2_SMALL,
}
BUCKET = 64  # recompute pads the sequence to a multiple of this
STEPS_TIMED = 32  # decode steps per per-token cost measurement


def build(shape: str, dtype: str, rows: int = 1, overrides: tuple[str, ...] = ()):
    """The model in decoding's layout for `rows` rows (txjax.decode.for_decoding), random parameters in `dtype`;
    `overrides` are --model.FIELD=V flags on the shape's config."""
    config = ml_collections.ConfigDict({"model": dataclasses.asdict(SHAPES[shape])})
    for flag in overrides:
        config_lib.apply_override(config, "--config." + flag.removeprefix("--"))
    cfg = dataclasses.replace(config_lib.model_config(config.model.to_dict()), dtype=dtype, scan_layers=False)
    model = DecoderLM(cfg)
    init = jax.jit(lambda key: nn.meta.unbox(model.init(key, jnp.zeros((1, 1), jnp.int32))["params"]))
    params = jax.tree_util.tree_map(lambda p: p.astype(dtype), init(jax.random.key(0)))
    return decode.for_decoding(model, params, rows)


def timed_s(fn, repeats: int) -> tuple[float, float]:
    """Median wall time and median CPU time (all threads of this process; steadier when other processes load the
    cores) of fn() (blocked on) over `repeats` calls after one untimed call (compilation)."""
    jax.block_until_ready(fn())
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        jax.block_until_ready(fn())
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return statistics.median(wall), statistics.median(cpu)


def cached_generation_s(model, params, n: int, repeats: int, first_bucket: int = 64) -> tuple[float, float]:
    """(wall, CPU) seconds of generating n tokens; first_bucket >= n: one cache of the whole capacity."""
    strategy = decode.Strategy(max_new_tokens=n)
    prompt_1x1, lengths_1 = jnp.zeros((1, 1), jnp.int32), jnp.ones((1,), jnp.int32)
    run = functools.partial(
        decode.generate_ids, model, params, strategy, 0, prompt_1x1, lengths_1, None, jax.random.key(0)
    )
    return timed_s(lambda: run(first_bucket=first_bucket), repeats)


def cached_steps(model, p: int, batch: int = 1):
    """(steps, fresh): steps(params, cache, token_C) runs decode steps at positions p-32..p-1 for `batch` rows in one
    jitted loop (the cache donated); fresh(params) is a cache of p slots prefilled with p-32 tokens per row."""
    first = p - STEPS_TIMED

    @functools.partial(jax.jit, donate_argnums=1)
    def steps(params, cache, token_C):
        def body(t, carry):
            cache, token_C = carry
            logits_CxV, cache = decode.extend(model, params, cache, token_C[:, None], jnp.full((batch, 1), t))
            return cache, decode.greedy_tokens(logits_CxV)  # as generate's greedy steps

        return jax.lax.fori_loop(first, p, body, (cache, token_C))

    prefill = jax.jit(
        lambda params, cache: decode.extend(
            model, params, cache, jnp.zeros((batch, first), jnp.int32), jnp.tile(jnp.arange(first), (batch, 1))
        )[1]
    )
    return steps, lambda params: prefill(params, init_cache(model, batch, p))


def cached_step_s(model, params, p: int, repeats: int) -> float:
    """Seconds per decode step at positions p-32..p-1 of a cache of p slots."""
    steps, fresh = cached_steps(model, p)
    jax.block_until_ready(steps(params, fresh(params), jnp.zeros((1,), jnp.int32)))  # compile
    times = []
    for _ in range(repeats):
        cache = jax.block_until_ready(fresh(params))
        start = time.perf_counter()
        jax.block_until_ready(steps(params, cache, jnp.zeros((1,), jnp.int32)))
        times.append(time.perf_counter() - start)
    return statistics.median(times) / STEPS_TIMED


@functools.cache
def recompute_fns(model, length: int):
    """jit(params, tokens [1, length], first, last) -> tokens with positions first..last-1 filled greedily, each
    by a full forward pass over all `length` slots (causal: the slots after the current token do not matter)."""

    def run(params, tokens_1xL, first, last):
        def body(t, tokens_1xL):
            with decode.kernels.installed():  # the decoding layout's parameters, read by its kernels
                logits_1xLxV = model.apply({"params": params}, tokens_1xL)
            return tokens_1xL.at[0, t].set(decode.greedy_tokens(logits_1xLxV[:, t - 1])[0])

        return jax.lax.fori_loop(first, last, body, tokens_1xL)

    return jax.jit(run, donate_argnums=1)


def padded_length(t: int) -> int:
    """The slots recompute runs to produce the token at position t: the multiple of 64 that holds positions 0..t."""
    return -(-(t + 1) // BUCKET) * BUCKET


def recompute_generation(model, params, n: int) -> jax.Array:
    """Greedy without a cache: positions 1..n (after a 1-token prompt), grouped by padded length."""
    tokens_1xL = jnp.zeros((1, 0), jnp.int32)
    for length in range(BUCKET, padded_length(n) + 1, BUCKET):
        tokens_1xL = jnp.pad(tokens_1xL, ((0, 0), (0, length - tokens_1xL.shape[1])))
        tokens_1xL = recompute_fns(model, length)(params, tokens_1xL, max(1, length - BUCKET), min(length, n + 1))
    return tokens_1xL


def recompute_step_s(model, params, length: int, repeats: int) -> float:
    """One recompute step (a full forward pass over `length` slots, as recompute_generation runs it)."""
    fn = recompute_fns(model, length)
    return timed_s(lambda: fn(params, jnp.zeros((1, length), jnp.int32), length - 1, length), repeats)[0]


def recompute_estimate_s(model, params, n: int, repeats: int) -> float:
    """Sum over the new tokens of the measured step time at their padded length."""
    lengths = [padded_length(t) for t in range(1, n + 1)]
    return sum(
        recompute_step_s(model, params, length, repeats) * lengths.count(length) for length in sorted(set(lengths))
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=tuple(SHAPES), default="shakespeare_char")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--lengths", default="64,256,1024")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--recompute_budget_s", type=float, default=60.0)
    parser.add_argument("--out", help="JSON path (default benchmarks/results/decode_SHAPE_DTYPE_PLATFORM.json)")
    args, overrides = parser.parse_known_args()
    common.warn_if_loaded()
    load_before = common.machine()["load_average_1min"]
    model, params = build(args.shape, args.dtype, overrides=tuple(overrides))
    sizes = summarize(model.cfg)
    lengths = [int(n) for n in args.lengths.split(",")]

    rows = []
    for n in lengths:
        cached, cached_cpu = cached_generation_s(model, params, n, args.repeats)
        capacity = cached_generation_s(model, params, n, args.repeats, first_bucket=n)[0]
        estimate = recompute_estimate_s(model, params, n, 3)
        measured = estimate <= args.recompute_budget_s
        if measured:
            recompute = timed_s(lambda n=n: recompute_generation(model, params, n), max(1, args.repeats // 2))[0]
        rows.append(
            {
                "new_tokens": n,
                "cached_tokens_per_s": n / cached,
                "cached_cpu_us_per_token": 1e6 * cached_cpu / n,
                "capacity_tokens_per_s": n / capacity,
                "recompute_tokens_per_s": n / (recompute if measured else estimate),
                "recompute": "measured" if measured else "est",
                "speedup": (recompute if measured else estimate) / cached,
            }
        )
    costs = []
    for p in (64, 1024):
        costs.append(
            {
                "position": p,
                "cached_ms_per_token": 1e3 * cached_step_s(model, params, p, args.repeats),
                "recompute_ms_per_token": 1e3 * recompute_step_s(model, params, p, args.repeats),
            }
        )
    print(f"{args.shape}, {args.dtype} weights, batch 1, greedy; median of {args.repeats} runs")
    print(common.table(rows))
    print()
    print(common.table(costs))
    result = next(r for r in rows if r["new_tokens"] == 256) if 256 in lengths else rows[-1]
    summary = {
        "shape": args.shape,
        "dtype": args.dtype,
        "new_tokens": result["new_tokens"],
        "cached_tokens_per_s": result["cached_tokens_per_s"],
        "cached_cpu_us_per_token": result["cached_cpu_us_per_token"],
        "capacity_tokens_per_s": result["capacity_tokens_per_s"],
        "recompute_tokens_per_s": result["recompute_tokens_per_s"],
        "recompute": result["recompute"],
        "cost_ratio_1024_vs_64": costs[1]["cached_ms_per_token"] / costs[0]["cached_ms_per_token"],
        "recompute_cost_ratio_1024_vs_64": costs[1]["recompute_ms_per_token"] / costs[0]["recompute_ms_per_token"],
        "parameters": sizes.total_params,
        "kv_bytes_per_token": sizes.kv_bytes_per_token,
        "repeats": args.repeats,
        "load_average_before": load_before,
        "load_average_after": common.machine()["load_average_1min"],
    }
    common.save(f"decode_{args.shape}_{args.dtype}", {"rows": rows, "costs": costs, "summary": summary}, args.out)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
