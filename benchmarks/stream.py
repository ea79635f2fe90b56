"""Streaming decode speed: `generate_stream` (what `run.py generate` prints from) against the same tokens from
`generate_windowed` in one compiled call per window, greedy, batch 1, a 1-token prompt, no stop token (every run
generates exactly N tokens), random weights (benchmarks/decode.py's shapes).

    python benchmarks/stream.py [--shape=shakespeare_char|gpt2_small] [--new_tokens=256] [--repeats=5] [--out=PATH]

After one untimed run of each (compilation), the two are timed alternately `repeats` times; the medians of wall and
CPU seconds (all threads of this process: steadier when other processes share the cores) give tokens/s and the
ratio streamed / one call. An A/B of two versions of txjax runs this file from each checkout in turn.
"""

from __future__ import annotations

import argparse
import statistics
import time

import common
from decode import SHAPES, build

from txjax import decode


def timed(fn) -> tuple[float, float]:
    start, start_cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - start, time.process_time() - start_cpu


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=tuple(SHAPES), default="shakespeare_char")
    parser.add_argument("--new_tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    common.warn_if_loaded()
    model, params = build(args.shape, "float32")
    run = dict(max_new_tokens=args.new_tokens, pad_id=0)
    ways = {
        "stream": lambda: list(decode.generate_stream(model, params, [0], **run)),
        "one_call": lambda: decode.generate_windowed(model, params, [0], **run)[0],
    }
    tokens = {name: fn() for name, fn in ways.items()}  # compiles
    assert tokens["stream"] == tokens["one_call"] and len(tokens["stream"]) == args.new_tokens, tokens
    times = {name: [] for name in ways}
    for _ in range(args.repeats):
        for name, fn in ways.items():
            times[name].append(timed(fn))
    row = {"shape": args.shape, "new_tokens": args.new_tokens, "repeats": args.repeats}
    for name, pairs in times.items():
        wall, cpu = (statistics.median(t[i] for t in pairs) for i in (0, 1))
        row |= {f"{name}_tokens_per_s": args.new_tokens / wall, f"{name}_cpu_us_per_token": 1e6 * cpu / args.new_tokens}
    row["stream_over_one_call_cpu"] = row["stream_cpu_us_per_token"] / row["one_call_cpu_us_per_token"]
    print(common.table([row]))
    path = common.save(f"stream_{args.shape}", {"result": row}, args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
