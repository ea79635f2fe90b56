"""A Gated DeltaNet layer (txjax.model.gated_deltanet, the chunked form) against a softmax attention layer of the
same size: time of one layer's forward and backward, and XLA's temporary memory as the context grows.

    python benchmarks/gated_deltanet.py [--shape=shakespeare_char] [--contexts=1024,2048,4096,8192,16384]
        [--time_context=1024] [--repeats=5]

The layers: the shape's MultiHeadAttention (attention_impl as the shape sets it, auto on a CPU the reference) and
a Gated DeltaNet of as many heads of the same head dim (query/key and value), both with their projections, one row
of one segment; timed is jit(grad) of sum(y * w) with respect to the input and the weights at --time_context, the
median of --repeats calls after warm-up (interleaved: txjax.ops.peak.time_calls); temp_mib is each compiled step's
temporary buffers (memory_analysis) at every context, compiled only: the softmax layer's L x L scores grow as L^2,
the linear layer's chunks as L x chunk.
"""

from __future__ import annotations

import common
import jax
import jax.numpy as jnp
import numpy as np
from attention_time import layer_step, parse_args

from txjax.config import model_config
from txjax.model.blockwise import Segments
from txjax.model.gated_deltanet import GatedDeltaNet


def delta_step(cfg, batch: int, context: int):
    """(jit(grad(sum(layer(x) * w))) of a Gated DeltaNet layer of cfg, its parameters, x), attention_time's form."""
    layer = GatedDeltaNet(cfg, name="linear_attention")
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(batch, context, cfg.d_model)), jnp.float32)
    w = jnp.asarray(rng.normal(size=x.shape), jnp.float32)
    seg = jnp.ones((batch, context), jnp.int32)
    params = layer.init(jax.random.key(0), x, Segments(seg, seg))
    loss = lambda p, x: (layer.apply(p, x, Segments(seg, seg)) * w).sum()
    return jax.jit(jax.grad(loss, argnums=(0, 1))), params, x


def main():
    args, base = parse_args(
        __doc__,
        "gated_deltanet",
        contexts="1024,2048,4096,8192,16384",
        blocks="",
        repeats=5,
        time_context={"type": int, "default": 1024},
    )
    configs = lambda context: {
        "softmax": model_config({**base, "max_len": context}),
        "gated_deltanet": model_config({**base, "max_len": context, "layer_types": "L"}),
    }
    steps = {"softmax": layer_step, "gated_deltanet": delta_step}
    timed = {}
    for name, cfg in configs(args.time_context).items():
        step, params, x = steps[name](cfg, 1, args.time_context)
        timed[name] = lambda step=step, params=params, x=x: step(params, x)
    times = common.time_calls(timed, args.repeats)
    ratio = times["gated_deltanet"]["median_ms"] / times["softmax"]["median_ms"]
    timing = {"context": args.time_context, **{f"{k}_ms": v["median_ms"] for k, v in times.items()}, "ratio": ratio}
    print(common.table([timing]), flush=True)
    rows = []
    for context in map(int, args.contexts.split(",")):
        row = {"context": context}
        for name, cfg in configs(context).items():
            step, params, x = steps[name](cfg, 1, context)
            row[f"{name}_temp_mib"] = step.lower(params, x).compile().memory_analysis().temp_size_in_bytes / 2**20
        rows.append(row)
        print(common.table(rows[-1:]), flush=True)
    print(common.table(rows))
    payload = {"shape": args.shape, "dtype": base["dtype"], "timing": timing, "times": times, "memory": rows}
    print(f"wrote {common.save(f'gated_deltanet_{args.shape}', payload, args.out)}")


if __name__ == "__main__":
    main()
