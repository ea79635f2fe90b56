"""The mixture-of-experts train step against the dense step of the same active FLOPs per token.

    python benchmarks/moe_step.py [--shape=shakespeare_char] [--experts=8] [--top_k=2] [--steps=40]
        [--batch_size=N] [--model.FIELD=V ...]

Dense: the shape's FFN of width d_ff. MoE: every layer `experts` experts of width d_ff / top_k, top_k of them per
token (the same expert FLOPs per token, plus the router's D x X), dropless (txjax.model.moe's grouped matmul), and
the same with capacity factor 1.25. Each variant is compiled once, then the variants' steps are timed interleaved
(benchmarks/train.py's method); ms/step is the median. `overhead` = MoE ms per token / dense ms per token (the
batches are the same, so the ratio of step times); the goal of issue 57 is <= 1.3. The FLOPs per step are
txjax.ops.summary.train_flops_per_batch (active parameters per token). Writes results/moe_step_PLATFORM.json.
"""

from __future__ import annotations

import argparse
import itertools
import time

import common
import jax
import train as train_bench

from txjax import config as config_lib
from txjax.ops.summary import train_flops_per_batch


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="shakespeare_char", choices=train_bench.SHAPES)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top_k", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40, help="timed steps per variant")
    parser.add_argument("--batch_size", type=int, help="rows per step (default: the shape's)")
    parser.add_argument("--out", help="JSON path (default benchmarks/results/moe_step_PLATFORM.json)")
    args, overrides = parser.parse_known_args()
    overrides = ["--config." + f.removeprefix("--") for f in overrides]
    if args.batch_size:
        overrides.append(f"--config.train.batch_size={args.batch_size}")
    common.warn_if_loaded()

    base = train_bench.build_config(args.shape, overrides)
    moe_d_ff = base.model.d_ff // args.top_k
    moe = [f"--config.model.num_experts={args.experts}", f"--config.model.experts_per_token={args.top_k}"]
    moe.append(f"--config.model.moe_d_ff={moe_d_ff}")
    variants = {
        "dense": [],
        "moe_dropless": moe,
        "moe_capacity_1.25": [*moe, "--config.model.moe_capacity_factor=1.25"],
    }
    batches = train_bench.lm_batches(base)
    device_batches = [jax.device_put(b) for b in batches]
    fns, flops, first_step_s = {}, {}, {}
    for name, flags in variants.items():
        config = train_bench.build_config(args.shape, overrides + flags)
        run = train_bench.stepper(config)
        cycle = itertools.cycle(device_batches)
        fns[name] = lambda run=run, cycle=cycle: run(next(cycle))
        flops[name] = train_flops_per_batch(config_lib.model_config(config.model.to_dict()), base.family, batches[0])
        start = time.perf_counter()
        jax.block_until_ready(fns[name]())
        first_step_s[name] = time.perf_counter() - start
        print(f"{name}: first step (compile) {first_step_s[name]:.1f} s", flush=True)
    timings = common.time_calls(fns, args.steps, 2, max(1, args.steps // 5))

    dense_ms = timings["dense"]["median_ms"]
    rows = [
        {
            "variant": name,
            "ms_per_step": s["median_ms"],
            "min_ms": s["min_ms"],
            "max_ms": s["max_ms"],
            "cpu_ms": s["cpu_ms"],
            "gflop_per_step": flops[name] / 1e9,
            "overhead": s["median_ms"] / dense_ms,
            "first_step_s": first_step_s[name],
        }
        for name, s in timings.items()
    ]
    b, t = base.train.batch_size, base.data.seq_len
    print(
        f"{args.shape}: batch {b} x {t} tokens, dtype {base.model.dtype}, d_ff {base.model.d_ff}; MoE: "
        f"{args.experts} experts, top-{args.top_k}, moe_d_ff {moe_d_ff}"
    )
    print(common.table(rows))
    path = common.save(
        "moe_step",
        {
            "shape": args.shape,
            "batch_size": b,
            "seq_len": t,
            "dtype": base.model.dtype,
            "experts": args.experts,
            "top_k": args.top_k,
            "moe_d_ff": moe_d_ff,
            "steps": args.steps,
            "rows": rows,
        },
        args.out,
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
