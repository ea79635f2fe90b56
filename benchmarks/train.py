"""Training throughput of txjax's own train_step (txjax.training.step.make_train_step): tokens/s, ms/step and MFU.

    python benchmarks/train.py --shape=shakespeare_char|baby_gpt|gpt2_small|marian_small
        [--dtype=float32,bfloat16] [--attention=auto,reference] [--scan_layers=true,false] [--steps=N]
        [--batch_size=N] [--model.FIELD=V ...]

Every variant (dtype x attention implementation x layer stacking; the stacking defaults to the experiment's) is
compiled once (first_step_s: its first call, compile or a load from jax's persistent cache included; the column
`runs` says what attention_impl=auto picked on this device), then timed per step after warm-up, the
variants interleaved in rounds (a loaded machine slows them alike); ms/step is the median, min and max of the timed
steps. The batches are built once and live on the device, so this measures the step, not the input pipeline
(the training loop prefetches batches in a background thread).

    MFU = model FLOPs per step / step time / measured peak (benchmarks/peak.py) of the variant's compute dtype
    model FLOPs per step = txjax.ops.summary.train_flops_per_batch (the training loop's count): (6N + 12·L·d·T) per
    token x the positions of the batch
Encoder-decoder (marian_small): 6·N_enc per source and 6·N_dec per target position, plus 12·d·(S² per encoder layer
+ T² + T·S per decoder layer) per row; target_tokens_per_s counts the target tokens that are not padding (what the
Hugging Face peer reports), slots_per_s every input position (source, target and padding), over real batches of
../shared/data/bible with an 8,000-piece vocabulary; the training loop logs the same two quantities.
The last line is JSON for the config txjax uses by default (the experiment's config as written).
"""

from __future__ import annotations

import argparse
import itertools
import json
import time

import common
import jax
import jax.numpy as jnp
import numpy as np

from txjax import config as config_lib
from txjax import families
from txjax.experiment import build_dataset, build_model, build_tokenizer
from txjax.model.attention import resolve_impl
from txjax.ops.summary import train_flops_per_batch
from txjax.parallel.distributed import first_device_mesh
from txjax.sections.train import TrainConfig
from txjax.state.optim import OptimConfig, make_optimizer
from txjax.state.train_state import init_state, state_shardings
from txjax.training.step import make_train_step

EXPERIMENTS = config_lib.REPO / "experiments"
NANOGPT_OPTIMIZER = {"train.optimizer": "adamw", "train.learning_rate": 1e-3}  # the peers' (shakespeare_char: Muon)
SHAPES = {  # name -> (experiment file, overrides of its config)
    "shakespeare_char": ("shakespeare_char.py", {"model.vocab_size": 65, "model.max_len": 64, **NANOGPT_OPTIMIZER}),
    "baby_gpt": (
        "shakespeare_char.py",
        {  # nanoGPT's train_shakespeare_char.py
            "model.vocab_size": 65,
            "model.max_len": 256,
            "data.seq_len": 256,
            "model.num_layers": 6,
            "model.num_heads": 6,
            "model.d_model": 384,
            "model.d_ff": 1536,
            "model.dropout": 0.2,
            "train.batch_size": 64,
            **NANOGPT_OPTIMIZER,
        },
    ),
    "gpt2_small": (
        "shakespeare_char.py",
        {
            "model.vocab_size": 50257,
            "model.max_len": 1024,
            "data.seq_len": 1024,
            "model.num_layers": 12,
            "model.num_heads": 12,
            "model.d_model": 768,
            "model.d_ff": 3072,
            "model.activation": "gelu_tanh",
            "model.use_bias": True,
            "train.batch_size": 8,
            **NANOGPT_OPTIMIZER,
        },
    ),
    "marian_small": (
        "bible_en_es.py",
        {  # the Hugging Face MarianMTModel peer of issue 8, its size forced
            "model.vocab_size": 8000,
            "model.max_len": 128,
            "data.vocab_size": 8000,
            "model.d_model": 256,
            "model.num_layers": 3,
            "model.num_encoder_layers": 3,
            "model.num_heads": 4,
            "model.num_kv_heads": None,
            "model.d_ff": 1024,
            "model.dropout": 0.1,
            "model.activation": "gelu",  # MarianConfig's (the experiment trains with ReLU^2 and RoPE)
            "model.positional": "sinusoidal",
            "model.share_embeddings": True,
            "model.tie_embeddings": True,
        },
    ),
}
CPU_BATCH = {"gpt2_small": 1}  # a few steps at a small batch: one GPT-2 step at batch 8 takes ~half a minute here
CPU_STEPS = {"shakespeare_char": 50, "baby_gpt": 10, "gpt2_small": 3, "marian_small": 12}  # timed steps per variant


def build_config(shape: str, overrides: list[str]):
    """The experiment's config with the shape's overrides, then the command line's."""
    experiment, shape_overrides = SHAPES[shape]
    config = config_lib.load_config(EXPERIMENTS / experiment)
    for key, value in shape_overrides.items():
        if value is None:
            config_lib.apply_override(config, f"--config.{key}=None")
        else:
            config_lib.apply_override(
                config, f"--config.{key}={json.dumps(value) if isinstance(value, bool) else value}"
            )
    for flag in overrides:
        config_lib.apply_override(config, flag)
    return config


def lm_batches(config, n: int = 4):
    """Random-token LM batches [B, T] (the step's cost does not depend on the token values)."""
    b, t, v = config.train.batch_size, config.data.seq_len, config.model.vocab_size
    rng = np.random.default_rng(0)
    ones = np.ones((b, t), np.int32)
    return [
        {
            "inputs": rng.integers(0, v, (b, t), dtype=np.int32),
            "targets": rng.integers(0, v, (b, t), dtype=np.int32),
            "weights": ones.astype(np.float32),
            "positions": np.broadcast_to(np.arange(t, dtype=np.int32), (b, t)),
            "segment_ids": ones,
        }
        for _ in range(n)
    ]


def seq2seq_batches(config, n: int = 16):
    """Real training batches of the parallel corpus (their padding is what a translation run pays for)."""
    workdir = config_lib.REPO / "runs" / "benchmarks" / "marian_small"  # the SentencePiece model, trained once
    with config_lib.user_errors():
        tokenizer = build_tokenizer(config, workdir)
        data = build_dataset(config, tokenizer, "train")
    return [data.batch(config.train.seed, k, config.train.batch_size) for k in range(n)]


def tokens_per_step(config, batches) -> tuple[float, int]:
    """(target tokens: the tokens predicted with weight > 0, mean over the batches; slots: every input position of
    a row, source, target and padding) per step, as the training loop's target_tokens_per_s and slots_per_s count."""
    family = families.get(config.family)
    b, s, t = families.batch_lengths(family, batches[0])
    return float(np.mean([(batch[family.labels[1]] > 0).sum() for batch in batches])), b * (s + t)


def stepper(config):
    """A no-argument function that runs one train_step (the state threaded through, batches cycled)."""
    model = build_model(config)
    tx = make_optimizer(OptimConfig.of(config.train), families.param_roles(model))
    # the state laid out as the step's own output (as the training loop's Run.init does): else the second call
    # meets another argument type than the first and compiles the step again
    mesh, seed = first_device_mesh(), config.train.seed
    state = jax.jit(lambda: init_state(model, tx, seed), out_shardings=state_shardings(model, tx, seed, mesh))()
    train_step = make_train_step(model, tx, TrainConfig.of(config.train), mesh)
    holder = [state]

    def run(batch):
        holder[0], metrics = train_step(holder[0], batch)
        return metrics["loss"], holder[0].step

    return run


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", required=True, choices=SHAPES)
    parser.add_argument("--dtype", default="float32,bfloat16", help="comma-separated compute dtypes")
    parser.add_argument("--attention", default="auto,reference", help="comma-separated attention_impl values")
    parser.add_argument("--scan_layers", help="comma-separated true/false (default: the experiment's)")
    parser.add_argument("--steps", type=int, help=f"timed steps per variant (default: 30; CPU: {CPU_STEPS})")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps after compiling")
    parser.add_argument("--rounds", type=int, help="interleaving rounds (default: steps/5, at least 1)")
    parser.add_argument("--batch_size", type=int, help="rows per step (default: the shape's)")
    parser.add_argument("--out", help="JSON path (default benchmarks/results/train_SHAPE_PLATFORM.json)")
    args, overrides = parser.parse_known_args()
    overrides = ["--config." + f.removeprefix("--") for f in overrides]  # --model.remat=true etc.
    on_cpu = common.platform_name() == "cpu"
    small = on_cpu and args.shape in CPU_BATCH
    batch_size = args.batch_size or (CPU_BATCH[args.shape] if small else None)
    if batch_size:
        overrides.append(f"--config.train.batch_size={batch_size}")
    steps = args.steps or (CPU_STEPS[args.shape] if on_cpu else 30)
    common.warn_if_loaded()

    base = build_config(args.shape, overrides)
    batches = seq2seq_batches(base) if base.family == "encoder_decoder" else lm_batches(base)
    default = (base.model.dtype, base.model.attention_impl, base.model.scan_layers)
    stacking = [s.lower() == "true" for s in args.scan_layers.split(",")] if args.scan_layers else [default[2]]
    variants = list(itertools.product(args.dtype.split(","), args.attention.split(","), stacking))
    variants = variants if default in variants else [default, *variants]
    peak = common.peak_gflops()
    cfg = config_lib.model_config(base.model.to_dict())
    flops = train_flops_per_batch(cfg, base.family, batches[0])
    tokens, slots = tokens_per_step(base, batches)
    device_batches = [jax.device_put(b) for b in batches]

    fns = {}
    for dtype, impl, scan in variants:
        config = build_config(args.shape, overrides)
        config.model.update(dtype=dtype, attention_impl=impl, scan_layers=scan)
        run, cycle = stepper(config), itertools.cycle(device_batches)
        fns[(dtype, impl, scan)] = lambda run=run, cycle=cycle: run(next(cycle))
    first_step_s = {}  # compiling (or loading from jax's persistent cache) and one step
    for key, fn in fns.items():
        start = time.perf_counter()
        jax.block_until_ready(fn())
        first_step_s[key] = time.perf_counter() - start
        print(f"{key}: first step (compile) {first_step_s[key]:.1f} s", flush=True)
    timings = common.time_calls(fns, steps, args.warmup, args.rounds or max(1, steps // 5))

    rows = []
    for (dtype, impl, scan), s in timings.items():
        seconds = s["median_ms"] / 1e3
        rows.append(
            {
                "dtype": dtype,
                "attention": impl,
                "runs": resolve_impl(impl, jnp.dtype(dtype), cfg.head_dim),  # what `auto` picked here
                "layers": "scan" if scan else "loop",
                "first_step_s": first_step_s[(dtype, impl, scan)],
                "default": (dtype, impl, scan) == default,
                "ms_per_step": s["median_ms"],
                "min_ms": s["min_ms"],
                "max_ms": s["max_ms"],
                "cpu_ms": s["cpu_ms"],
                "target_tokens_per_s": tokens / seconds,
                "slots_per_s": slots / seconds,
                "tflops": flops / seconds / 1e12,
                "mfu": flops / seconds / (peak[dtype] * 1e9),
            }
        )
    print(
        f"{args.shape}: batch {base.train.batch_size}, {tokens:,.0f} target tokens and {slots:,} slots per step, "
        f"{flops / 1e9:,.2f} GFLOP/step, peak GFLOP/s {peak['float32']:,.0f} (f32) / {peak['bfloat16']:,.0f} (bf16)"
        f"{'; CPU: a few steps at a small batch' if small else ''}"
    )
    print(common.table(rows))
    path = common.save(
        f"train_{args.shape}",
        {
            "shape": args.shape,
            "config": base.to_dict(),
            "steps": steps,
            "target_tokens_per_step": tokens,
            "slots_per_step": slots,
            "flops_per_step": flops,
            "peak_gflops": peak,
            "rows": rows,
        },
        args.out,
    )
    print(f"wrote {path}")
    chosen = next(r for r in rows if r["default"])
    print(
        json.dumps(
            {
                "shape": args.shape,
                "dtype": chosen["dtype"],
                "attention": chosen["attention"],
                "layers": chosen["layers"],
                "batch_size": base.train.batch_size,
                **{k: chosen[k] for k in ("ms_per_step", "first_step_s", "target_tokens_per_s", "slots_per_s", "mfu")},
            }
        )
    )


if __name__ == "__main__":
    main()
