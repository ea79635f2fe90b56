"""Memory bandwidth: what bounds batch-1 decoding. Each variant reads GPT-2 small's output matrix E [50257, 768]
once (154 MB in float32) and is timed per call (median, interleaved); GB/s = bytes of E / time.

    python benchmarks/bandwidth.py [--calls=N]

- numpy sum, jax sum: a plain reduction, the machine's streaming rate with no arithmetic to speak of
- numpy / jax matvec float32: E x, what a cached decoding step does with each weight matrix (BLAS / XLA dot)
- jax matvec bfloat16: bf16(E) bf16(x) accumulated in float32 (XLA:CPU's dot)
- jax convert-multiply-reduce bfloat16: sum_d f32(E[v, d]) x[d] written as one fused elementwise + reduce, the
  way to read half the bytes when the dot is slow
- jax convert-multiply-reduce int8: the same with int8 weights and one float32 scale per row (per output channel),
  sum_d f32(E8[v, d]) x[d] * s[v]: a quarter of the float32 bytes
A float32 GPT-2 token reads 497 MB of weights, so at G GB/s decoding is bounded by G / 0.497 tokens/s.
Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json

import common
import jax
import jax.numpy as jnp
import numpy as np

GPT2_FLOAT32_BYTES = 497e6  # every weight of GPT-2 small, read once per decoded token


def stream_rates(calls: int) -> list[dict]:
    """One row per variant: GB/s and G values/s reading E once (median of `calls`, the variants interleaved)."""
    rng = np.random.default_rng(0)
    e_VxD = rng.standard_normal((50257, 768), np.float32)
    x_D = rng.standard_normal(768, np.float32)
    e32, e16, x = jnp.asarray(e_VxD), jnp.asarray(e_VxD, jnp.bfloat16), jnp.asarray(x_D)
    scale_V = np.abs(e_VxD).max(-1) / 127
    e8, s_V = jnp.asarray(np.round(e_VxD / scale_V[:, None]).astype(np.int8)), jnp.asarray(scale_V)
    matvec = jax.jit(lambda e, x: jnp.einsum("vd,d->v", e, x, preferred_element_type=jnp.float32))
    widen_reduce = jax.jit(lambda e, x: (e.astype(jnp.float32) * x).sum(-1))
    widen_reduce_scaled = jax.jit(lambda e, s, x: (e.astype(jnp.float32) * x).sum(-1) * s)
    total = jax.jit(jnp.sum)
    variants = {
        "numpy sum float32": (e_VxD.sum, e_VxD),
        "numpy matvec float32": (lambda: e_VxD @ x_D, e_VxD),
        "jax sum float32": (lambda: total(e32), e32),
        "jax matvec float32": (lambda: matvec(e32, x), e32),
        "jax matvec bfloat16": (lambda: matvec(e16, x.astype(jnp.bfloat16)), e16),
        "jax convert-multiply-reduce bfloat16": (lambda: widen_reduce(e16, x), e16),
        "jax convert-multiply-reduce int8": (lambda: widen_reduce_scaled(e8, s_V, x), e8),
    }
    timed = common.time_calls({k: fn for k, (fn, _) in variants.items()}, calls, rounds=3)
    return [
        {
            "variant": k,
            "GB/s": e.nbytes / timed[k]["median_ms"] * 1e-6,
            "G values/s": e.size / timed[k]["median_ms"] * 1e-6,
        }
        for k, (_, e) in variants.items()
    ]


def best_float32_gb_s(rows: list[dict]) -> float:
    """The float32 streaming rate that bounds batch-1 decoding: the fastest float32 read of stream_rates."""
    return max(r["GB/s"] for r in rows if "float32" in r["variant"])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=30, help="timed calls per variant")
    args = parser.parse_args()
    common.warn_if_loaded()
    rows = stream_rates(args.calls)
    print(common.table(rows))
    best_float32 = best_float32_gb_s(rows)
    result = {"rows": rows, "gpt2_float32_tokens_per_s_bound": best_float32 * 1e9 / GPT2_FLOAT32_BYTES}
    print(f"wrote {common.save('bandwidth', result)}")
    print(
        json.dumps(
            {
                "gpt2_float32_tokens_per_s_bound": result["gpt2_float32_tokens_per_s_bound"],
                **{r["variant"]: r["GB/s"] for r in rows},
            }
        )
    )


if __name__ == "__main__":
    main()
