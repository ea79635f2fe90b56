"""The measured matmul ceiling of this device: GFLOP/s of large square matmuls through jax (median of repeats).

Variants: float32; bfloat16 inputs with float32 accumulation (preferred_element_type=float32, what txjax's
bfloat16 layers ask for); bfloat16 with a bfloat16 result. A matmul of two n x n matrices is 2 n^3 FLOPs, so

    GFLOP/s = 2 n^3 / median seconds per call / 1e9

and the peak of a dtype (the MFU denominator of the training loop and of benchmarks/train.py) is the best median
over sizes. `peak_gflops()` measures one size once per device kind and caches the result as JSON in
$TXJAX_CACHE_DIR (default ~/.cache/txjax)/peak_<device kind>.json; `python benchmarks/peak.py` measures every size.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp

VARIANTS = {  # name -> (input dtype, preferred_element_type, precision)
    "float32": (jnp.float32, None, "highest"),  # float32 products: XLA's GPU default would be TF32
    "tensorfloat32": (jnp.float32, None, "high"),  # measured on GPUs only: on a CPU it is the float32 product
    "bfloat16": (jnp.bfloat16, jnp.float32, None),
    "bfloat16 (bf16 result)": (jnp.bfloat16, None, None),
}
QUICK_REPEATS = {"cpu": 3, "gpu": 50}  # peak_gflops(): ~1-2 s on a CPU; a GPU's ms-long calls need more to settle


def stats_ms(seconds: list[float], cpu_seconds: list[float]) -> dict:
    """Median, min and max of per-call wall times and the median CPU time of the process (all its threads), in
    milliseconds. On a machine other processes load, CPU time is the steadier of the two."""
    ms = [1e3 * s for s in seconds]
    return {
        "median_ms": statistics.median(ms),
        "min_ms": min(ms),
        "max_ms": max(ms),
        "calls": len(ms),
        "cpu_ms": 1e3 * statistics.median(cpu_seconds),
    }


def time_calls(fns: dict[str, Callable[[], object]], calls: int, warmup: int = 2, rounds: int = 1) -> dict:
    """Per-call wall time of each fn() (its result is blocked on), interleaved: `rounds` rounds in which every
    variant makes calls/rounds calls after `warmup` untimed ones, so slow phases of a loaded machine hit all variants
    alike. Returns {name: stats_ms(...)}."""
    for fn in fns.values():
        for _ in range(warmup):
            jax.block_until_ready(fn())
    wall: dict[str, list[float]] = {name: [] for name in fns}
    cpu: dict[str, list[float]] = {name: [] for name in fns}
    per_round = max(1, calls // rounds)
    for _ in range(rounds):
        for name, fn in fns.items():
            for _ in range(per_round):
                start, start_cpu = time.perf_counter(), time.process_time()
                jax.block_until_ready(fn())
                wall[name].append(time.perf_counter() - start)
                cpu[name].append(time.process_time() - start_cpu)
    return {name: stats_ms(wall[name], cpu[name]) for name in fns}


def sizes(quick: bool) -> list[int]:
    """Matrix sizes n: large enough to reach the ceiling, small enough to time in seconds."""
    if jax.devices()[0].platform == "cpu":
        return [2048] if quick else [1024, 2048, 4096]
    return [8192] if quick else [8192, 16384]  # smaller GPU products leave the chip partly idle


def _matmul_fns(variants: dict) -> dict[str, Callable]:
    """{variant: a @ b at the variant's accumulation type and precision} (not jitted)."""
    return {
        name: lambda a, b, acc=acc, p=precision: jnp.matmul(a, b, preferred_element_type=acc, precision=p)
        for name, (_, acc, precision) in variants.items()
    }


def _matmul_calls(n: int, variants: dict) -> dict[str, Callable[[], jax.Array]]:
    """{variant: a no-argument call of jit(a_nxn @ b_nxn)} on random inputs of the variant's dtype."""
    calls = {}
    for name, matmul in _matmul_fns(variants).items():
        dtype = variants[name][0]
        a_nxn = jax.random.normal(jax.random.key(0), (n, n), dtype)
        b_nxn = jax.random.normal(jax.random.key(1), (n, n), dtype)
        jitted = jax.jit(matmul)
        calls[name] = lambda f=jitted, a=a_nxn, b=b_nxn: f(a, b)
    return calls


def measure(quick: bool = False, repeats: int | None = None, variants: dict = VARIANTS) -> dict:
    """{'rows': [{variant, n, gflops_median, gflops_best, ms_median}], 'peak_gflops': {'float32': ..,
    'bfloat16': ..}}: 2 n^3 FLOPs per call over the median (and the fastest) of `repeats` timed calls."""
    repeats = repeats or (5 if quick else 20)
    if jax.devices()[0].platform != "gpu":
        variants = {name: v for name, v in variants.items() if name != "tensorfloat32"}
    rows = []
    for n in sizes(quick):
        warmup = 2 if jax.devices()[0].platform == "cpu" else 10  # a GPU ramps up its clocks
        timings = time_calls(_matmul_calls(n, variants), repeats, warmup=warmup, rounds=max(1, repeats // 5))
        rows += [
            {
                "variant": name,
                "n": n,
                "gflops_median": 2 * n**3 / s["median_ms"] / 1e6,
                "gflops_best": 2 * n**3 / s["min_ms"] / 1e6,
                "ms_median": s["median_ms"],
            }
            for name, s in timings.items()
        ]
    best = lambda v: max(r["gflops_median"] for r in rows if r["variant"] == v)
    return {"rows": rows, "peak_gflops": {"float32": best("float32"), "bfloat16": best("bfloat16")}}


def cache_dir() -> Path:
    """txjax's per-user cache folder: $TXJAX_CACHE_DIR, default ~/.cache/txjax (measured peaks, compiled programs)."""
    return Path(os.environ.get("TXJAX_CACHE_DIR") or Path.home() / ".cache" / "txjax")


def cache_path() -> Path:
    """cache_dir()/peak_<device kind>.json, the kind made safe for a file name."""
    kind = re.sub(r"[^A-Za-z0-9.-]+", "_", jax.devices()[0].device_kind)
    return cache_dir() / f"peak_{kind}.json"


def peak_gflops() -> dict[str, float]:
    """{'float32': GFLOP/s, 'bfloat16': GFLOP/s (bf16 inputs, f32 accumulation)} of this device kind: read from
    cache_path(), or measured now (one size, QUICK_REPEATS calls; no bf16-result variant) and written there."""
    path = cache_path()
    if path.is_file():
        return json.loads(path.read_text())["peak_gflops"]
    wanted = {name: VARIANTS[name] for name in ("float32", "bfloat16")}
    result = measure(quick=True, repeats=QUICK_REPEATS.get(jax.devices()[0].platform, 3), variants=wanted)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.tmp")  # renamed into place: a reader never sees half a file
    partial.write_text(json.dumps({"device_kind": jax.devices()[0].device_kind, **result}, indent=1) + "\n")
    partial.replace(path)
    return result["peak_gflops"]
