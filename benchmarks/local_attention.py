"""Local (sliding-window) against global causal self-attention, blockwise (txjax.model.blockwise): time and XLA's
temporary memory of one layer's forward and backward as the context grows at a fixed window.

    python benchmarks/local_attention.py [--shape=shakespeare_char] [--contexts=2048,4096,8192] [--window=256]
        [--blocks=256x256] [--repeats=3]

Timed is attention_time.layer_step (jit(grad) of sum(attention(x) * w), projections included, one row of one
segment), the median of --repeats calls after a warm-up; temp_mib is the compiled step's temporary buffers
(memory_analysis); block_pairs the (query block, key block) products the forward pass computes (blockwise's own
loop bounds, _kv_blocks: the backward computes as many), the count that timings on a shared machine blur. A query
block reads the key blocks from its first query's oldest visible key on, so the local rows grow as L * window, the
global ones as L^2 (memory is O(L) in both: blockwise never holds the L x L scores).
"""

from __future__ import annotations

import common
import jax
import jax.numpy as jnp
from attention_time import layer_seconds, layer_step, parse_args

from txjax.config import model_config
from txjax.model import blockwise


def block_pairs(context: int, window: int, bq: int, bk: int) -> int:
    """The key blocks the causal query blocks of one sequence read, summed (blockwise._kv_blocks)."""
    plan, nq, nk = blockwise.Plan(True, 1.0, bq, bk), -(-context // bq), -(-context // bk)
    w = jnp.int32(window) if window else None
    return sum(int(last) - int(first) for first, last in (blockwise._kv_blocks(plan, i, nk, w) for i in range(nq)))


def main():
    window = {"type": int, "default": 256}
    args, base = parse_args(
        __doc__, "local_attention", contexts="2048,4096,8192", blocks="256x256", repeats=3, window=window
    )
    bq, bk = map(int, args.blocks.split("x"))
    rows = []
    for context in map(int, args.contexts.split(",")):
        for window in (0, args.window):
            cfg = model_config(
                {**base, "max_len": context, "attention_impl": "blockwise", "attention_block_q": bq}
                | {"attention_block_kv": bk, "attention_window": window}
            )
            step, params, x = layer_step(cfg, 1, context)
            temp = step.lower(params, x).compile().memory_analysis().temp_size_in_bytes
            seconds = layer_seconds(cfg, 1, context, args.repeats)
            pairs = block_pairs(context, window, bq, bk)
            rows.append({"context": context, "window": window, "block_pairs": pairs, "ms": seconds * 1e3})
            rows[-1]["temp_mib"] = temp / 2**20
            print(common.table(rows[-1:]), flush=True)
    print(common.table(rows))
    payload = {"shape": args.shape, "blocks": args.blocks, "dtype": base["dtype"], "rows": rows}
    payload["backend"] = jax.default_backend()
    print(f"wrote {common.save(f'local_attention_{args.shape}', payload, args.out)}")


if __name__ == "__main__":
    main()
