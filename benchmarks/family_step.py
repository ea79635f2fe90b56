"""Training step time of the family comparison's settings (experiments/ablations/family_comparison*.py): the
encoder-decoder, the prefix LM and the decoder-only LM at matched parameter counts, on real batches of the task.

    python benchmarks/family_step.py --sweep=experiments/ablations/family_comparison.py [--steps=N]

Each setting of the sweep file (seed 0) is compiled once, then timed per step after warm-up, the settings
interleaved in rounds (benchmarks/train.py's method: a loaded machine slows them alike, so their ratios hold). The
comparison trains each setting for the steps its budget holds: budget / ms_per_step, with the encoder-decoder's
own rate anchoring the minutes (the sweep file's docstring).
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import common
import jax
from train import stepper, tokens_per_step

from txjax import config as config_lib
from txjax.experiment import build_dataset, build_model, build_tokenizer, fill_model_sizes
from txjax.ops.summary import param_shapes
from txjax.sweep import spec

WORKDIR = config_lib.REPO / "runs" / "benchmarks" / "family_step"  # each task's tokenizer, trained once


def real_batches(config, n: int = 8) -> list[dict]:
    """The first n training batches of the task in the family's form; fills the config's model sizes."""
    with config_lib.user_errors():
        tokenizer = build_tokenizer(config, WORKDIR / config.data.kind)
        data = build_dataset(config, tokenizer, "train")
    fill_model_sizes(config, tokenizer, data)
    return [data.batch(config.train.seed, k, config.train.batch_size) for k in range(n)]


def num_params(config) -> int:
    return sum(s.size for s in jax.tree.leaves(param_shapes(build_model(config))))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", required=True, help="a family comparison sweep file")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per setting")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps after compiling")
    args = parser.parse_args()
    common.warn_if_loaded()
    runs = spec.expand(spec.load_sweep(args.sweep), [], WORKDIR)
    runs = [run for run in runs if run.config.train.seed == runs[0].config.train.seed]
    fns, rows = {}, {}
    for run in runs:
        config = run.config
        batches = real_batches(config)
        tokens, _ = tokens_per_step(config, batches)
        params = num_params(config)
        step, cycle = stepper(config), itertools.cycle([jax.device_put(b) for b in batches])
        fns[run.name] = lambda step=step, cycle=cycle: step(next(cycle))
        jax.block_until_ready(fns[run.name]())
        rows[run.name] = {"setting": run.name, "family": config.family, "params": params, "target_tokens": tokens}
    timings = common.time_calls(fns, args.steps, args.warmup, max(1, args.steps // 2))
    anchor = timings[runs[0].name]["median_ms"]
    for name, s in timings.items():
        rows[name] |= {k: s[k] for k in ("median_ms", "min_ms", "max_ms")} | {"relative": s["median_ms"] / anchor}
    print(common.table(list(rows.values())))
    path = common.save(f"family_step_{Path(args.sweep).stem}", {"rows": list(rows.values())})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
