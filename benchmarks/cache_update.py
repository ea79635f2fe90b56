"""What writing one token into a layer's KV cache costs on XLA:CPU, per dtype and formulation: the reason a
bfloat16 decode step at batch 32 spends a third of its time in cache writes (benchmarks/decode_profile.py
--dtype=bfloat16 --batch=32).

    python benchmarks/cache_update.py [--calls=20]

The cache is SmolLM2-135M's at batch 32 and 256 slots in decoding's cache_layout: keys [B*KV, K, S] = [96, 64, 256]
(a write is one column, slot i), values [B*KV, S, K] = [96, 256, 64] (one row). Each call runs 32 writes in one
jitted loop on a donated cache (in place when XLA can), as a decode loop does; us per write = median / 32.
- dynamic_update_slice: what attention._update_cache does
- select over an iota: where(slot == i, new, cache), a full pass over the cache instead of a write
Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import functools
import json

import common
import jax
import jax.numpy as jnp

WRITES = 32
LAYOUTS = {"keys [96, 64, 256]": ((96, 64, 256), 2), "values [96, 256, 64]": ((96, 256, 64), 1)}


def writes(shape, axis: int, dtype, how: str):
    """jit(cache, new) -> the cache with `new` (float32, one slot) written at slots 0..WRITES-1 in turn."""

    def write(cache, new, i):
        new = new.astype(dtype)
        if how == "select":
            return jnp.where(jax.lax.broadcasted_iota(jnp.int32, shape, axis) == i, new, cache)
        return jax.lax.dynamic_update_slice(cache, new, tuple(i if a == axis else 0 for a in range(len(shape))))

    @functools.partial(jax.jit, donate_argnums=0)
    def run(cache, new):
        return jax.lax.fori_loop(0, WRITES, lambda i, c: write(c, new * i, i), cache)

    return run


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    common.warn_if_loaded()
    caches, fns = {}, {}
    for layout, (shape, axis) in LAYOUTS.items():
        new_shape = tuple(1 if a == axis else n for a, n in enumerate(shape))
        for dtype in (jnp.float32, jnp.bfloat16):
            for how in ("dynamic_update_slice", "select"):
                name = f"{layout} {jnp.dtype(dtype).name} {how}"
                run, new = writes(shape, axis, dtype, how), jnp.ones(new_shape, jnp.float32)
                caches[name] = jnp.zeros(shape, dtype)

                def call(name=name, run=run, new=new):  # the donated cache comes back as the next call's
                    caches[name] = run(caches[name], new)
                    return caches[name]

                fns[name] = call
    timed = common.time_calls(fns, calls=args.calls, rounds=2)
    rows = [
        {"cache": name.rsplit(" ", 2)[0], "dtype": name.split()[-2], "write": name.split()[-1]}
        | {"us_per_write": timed[name]["median_ms"] * 1e3 / WRITES}
        for name in fns
    ]
    print(common.table(rows))
    print(f"wrote {common.save('cache_update', {'rows': rows, 'writes_per_call': WRITES})}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
