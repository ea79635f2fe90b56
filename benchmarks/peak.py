"""The measured matmul ceiling of this machine: GFLOP/s of large square matmuls through jax (median of repeats).

    python benchmarks/peak.py [--repeats=N] [--quick]

Variants: float32; bfloat16 inputs with float32 accumulation (preferred_element_type=float32, what txjax's
bfloat16 layers ask for); bfloat16 with a bfloat16 result. A matmul of two n x n matrices is 2 n^3 FLOPs.
The peak of a dtype (used as the MFU denominator by benchmarks/train.py) is the best median over sizes.
"""

from __future__ import annotations

import argparse

import common  # noqa: F401  (puts the repo on sys.path)
import jax
import jax.numpy as jnp

VARIANTS = {  # name -> (input dtype, preferred_element_type)
    "float32": (jnp.float32, None),
    "bfloat16": (jnp.bfloat16, jnp.float32),
    "bfloat16 (bf16 result)": (jnp.bfloat16, None),
}


def sizes(quick: bool) -> list[int]:
    if common.platform_name() == "cpu":
        return [2048] if quick else [1024, 2048, 4096]
    return [8192] if quick else [4096, 8192, 16384]


def measure(quick: bool = False, repeats: int | None = None) -> dict:
    """{'rows': [...], 'peak_gflops': {'float32': .., 'bfloat16': ..}}."""
    repeats = repeats or (5 if quick else 20)
    rows = []
    for n in sizes(quick):
        fns = {}
        for name, (dtype, acc) in VARIANTS.items():
            a = jax.random.normal(jax.random.key(0), (n, n), dtype)
            b = jax.random.normal(jax.random.key(1), (n, n), dtype)
            matmul = jax.jit(lambda a, b, acc=acc: jnp.matmul(a, b, preferred_element_type=acc))
            fns[name] = lambda f=matmul, a=a, b=b: f(a, b)
        for name, s in common.time_calls(fns, repeats, warmup=2, rounds=max(1, repeats // 5)).items():
            rows.append({"variant": name, "n": n, "gflops_median": 2 * n**3 / s["median_ms"] / 1e6,
                         "gflops_best": 2 * n**3 / s["min_ms"] / 1e6, "ms_median": s["median_ms"]})
    best = lambda v: max(r["gflops_median"] for r in rows if r["variant"] == v)
    return {"rows": rows, "peak_gflops": {"float32": best("float32"), "bfloat16": best("bfloat16")}}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, help="timed calls per size and variant (default 20, quick 5)")
    parser.add_argument("--quick", action="store_true", help="one size, 5 repeats")
    parser.add_argument("--out", help="JSON path (default benchmarks/results/peak_PLATFORM.json)")
    args = parser.parse_args()
    common.warn_if_loaded()
    result = measure(args.quick, args.repeats)
    print(common.table(result["rows"]))
    print(f"peak GFLOP/s: {result['peak_gflops']}")
    print(f"wrote {common.save('peak', result, args.out)}")


if __name__ == "__main__":
    main()
