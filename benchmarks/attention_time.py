"""Time of one causal self-attention layer, forward and backward, blockwise (txjax.model.blockwise) against the
reference.

    python benchmarks/attention_time.py [--shape=shakespeare_char] [--contexts=1024,4096] [--batch_size=1]
        [--blocks=512x512] [--repeats=5]

The layer is txjax's MultiHeadAttention of the shape (heads, K/V heads, head dim, compute dtype, positional
encoding), its projections included, at batch_size rows of one segment; timed is jit(grad) of sum(y * w) with
respect to the input and the weights, the median of --repeats calls after one warm-up; `ratio` is blockwise over
reference per block size. A reference case whose L x L float32 scores exceed 4 GB per head group is not run.
"""

from __future__ import annotations

import argparse
import statistics
import time

import common
import jax
import jax.numpy as jnp
import numpy as np
from train import SHAPES, build_config

from txjax.config import model_config
from txjax.model.blockwise import Segments
from txjax.model.layers import make_attention


def layer_seconds(cfg, batch: int, context: int, repeats: int) -> float:
    """Median seconds of grad(sum(attention(x) * w)) for the layer of cfg."""
    step, params, x = layer_step(cfg, batch, context)
    jax.block_until_ready(step(params, x))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(step(params, x))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def layer_step(cfg, batch: int, context: int):
    """(jit(grad(sum(attention(x) * w))) for the layer of cfg, its parameters, x): one segment of `context` tokens
    per row, causal, the layer's own window (cfg.layer_attention[0])."""
    mha = make_attention(cfg, cross=False, name="attention")
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(batch, context, cfg.d_model)), jnp.float32)
    w = jnp.asarray(rng.normal(size=x.shape), jnp.float32)
    pos = jnp.broadcast_to(jnp.arange(context, dtype=jnp.int32), (batch, context))
    seg = jnp.ones((batch, context), jnp.int32)
    mask = Segments(seg, seg) if cfg.attention_impl == "blockwise" else seg[:, None, None, :] > 0
    kw = dict(q_pos=pos, causal=True, layer=cfg.layer_attention[0])
    params = mha.init(jax.random.key(0), x, mask, **kw)
    loss = lambda p, x: (mha.apply(p, x, mask, **kw) * w).sum()
    return jax.jit(jax.grad(loss, argnums=(0, 1))), params, x


def parse_args(doc: str, name: str, *, contexts: str, blocks: str, repeats: int, **more: dict):
    """(args, the shape's model fields) of an attention benchmark `name`: --shape, --contexts, --blocks, --repeats,
    --out, and the benchmark's own flags `more` ({flag: add_argument keywords}); a loaded machine is warned of."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="shakespeare_char", choices=[s for s in SHAPES if s != "marian_small"])
    parser.add_argument("--contexts", default=contexts)
    parser.add_argument("--blocks", default=blocks, help="QxKV block sizes (attention_time: comma-separated)")
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--out", help=f"JSON path (default benchmarks/results/{name}_SHAPE_PLATFORM.json)")
    for flag, keywords in more.items():
        parser.add_argument(f"--{flag}", **keywords)
    args = parser.parse_args()
    common.warn_if_loaded()
    return args, build_config(args.shape, []).model.to_dict()


def main():
    batch_size = {"type": int, "default": 1}
    args, base = parse_args(
        __doc__, "attention_time", contexts="1024,4096", blocks="512x512", repeats=5, batch_size=batch_size
    )
    rows = []
    for context in map(int, args.contexts.split(",")):
        cfg = lambda context=context, **kw: model_config({**base, "max_len": context, **kw})
        ref_cfg = cfg(attention_impl="reference")
        scores_gb = 4 * args.batch_size * ref_cfg.num_heads * context**2 / 2**30
        reference = layer_seconds(ref_cfg, args.batch_size, context, args.repeats) if scores_gb <= 4 else None
        for blocks in args.blocks.split(","):
            bq, bk = map(int, blocks.split("x"))
            blk = cfg(attention_impl="blockwise", attention_block_q=bq, attention_block_kv=bk)
            seconds = layer_seconds(blk, args.batch_size, context, args.repeats)
            rows.append(
                {
                    "context": context,
                    "blocks": blocks,
                    "reference_ms": None if reference is None else reference * 1e3,
                    "blockwise_ms": seconds * 1e3,
                    "ratio": None if reference is None else seconds / reference,
                }
            )
            print(common.table(rows[-1:]), flush=True)
    print(common.table(rows))
    payload = {"shape": args.shape, "batch_size": args.batch_size, "dtype": base["dtype"], "rows": rows}
    print(f"wrote {common.save(f'attention_time_{args.shape}', payload, args.out)}")


if __name__ == "__main__":
    main()
