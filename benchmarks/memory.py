"""Peak memory of one training step against context length, with and without remat (activation checkpointing).

    python benchmarks/memory.py [--contexts=1024,4096,16384] [--shape=shakespeare_char] [--batch_size=1]
        [--max_gb=8] [--attention=auto] [--remat=false,true] [--sequence=1] [--steps=2]
    python benchmarks/memory.py --attention=blockwise --contexts=4096,16384,32768,65536 --max_gb=20 --steps=1
    python benchmarks/memory.py --attention=blockwise --sequence=1,4 --contexts=16384,32768 --max_gb=0

Each (context, remat) case runs in a fresh subprocess that builds the shape's model at that context, compiles
txjax's train_step and runs --steps steps (compiled before the first); tokens/s is the last step's.
With --attention=blockwise (txjax.model.blockwise) the attention holds no context x context matrix, and the rows
end with a least-squares line through the measured peaks (or XLA's figures where none ran): GB per 1k tokens of context.
Measured: on CPU the subprocess's peak resident memory (ru_maxrss; it
includes the ~0.5 GB of Python and jax, reported alone as 'base_gb'), on GPU the device's peak_bytes_in_use. XLA's
own figure for the compiled step (arguments + outputs + temporaries, from `memory_analysis()`) is reported too; a
case whose figure exceeds --max_gb is not run (it would push a shared machine into swap or the OOM killer).
--sequence=1,4: each case also on a mesh of N devices on the sequence axis (mesh.sequence = N: ring attention; a CPU
child simulates N host devices), where XLA's figure is one device's share (against 1 device: about 1/N).
The layers are stacked with nn.scan in every case: XLA:CPU schedules the recomputation of a remat'ed Python-loop
stack early and keeps its activations anyway (8 layers at context 2048: 1.77 GB of temporaries without remat, 1.80
with; scanned: 1.51 and 0.37).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import common
import jax
from train import SHAPES, build_config, lm_batches

from txjax.experiment import build_model
from txjax.families import param_roles
from txjax.parallel.distributed import run_mesh
from txjax.parallel.sharding import global_batch
from txjax.sections.train import TrainConfig
from txjax.state.optim import OptimConfig, make_optimizer
from txjax.state.train_state import init_state, state_shardings
from txjax.training.step import make_train_step

GB = 2**30


def max_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB  # Linux: KiB


def case(shape: str, overrides: list[str], max_gb: float, steps: int) -> dict:
    """In this process: compile the step and read XLA's memory figure (arguments + outputs + temporaries); when it
    is under max_gb, run `steps` steps and measure the peak."""
    base = max_rss_gb()  # Python, jax and txjax imported
    config = build_config(shape, overrides)
    model, mesh = build_model(config), run_mesh(config.mesh)
    tx = make_optimizer(OptimConfig.of(config.train), param_roles(model))
    shardings = state_shardings(model, tx, config.train.seed, mesh)
    state = jax.jit(lambda: init_state(model, tx, config.train.seed), out_shardings=shardings)()
    batch = global_batch(lm_batches(config, 1)[0], mesh)
    step = make_train_step(model, tx, TrainConfig.of(config.train), mesh).lower(state, batch).compile()
    m = step.memory_analysis()
    out = {
        "xla_estimate_gb": (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes) / GB,
        "base_gb": base,
        "peak_gb": None,
    }
    if out["xla_estimate_gb"] <= max_gb:
        for _ in range(steps):
            start = time.perf_counter()
            state, metrics = step(state, batch)
            jax.block_until_ready(metrics)
        out["tokens_per_s"] = batch["inputs"].size / (time.perf_counter() - start)
        device = jax.devices()[0]
        stats = device.memory_stats() if device.platform == "gpu" else None
        out["peak_gb"] = stats["peak_bytes_in_use"] / GB if stats else max_rss_gb()
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contexts", default="1024,4096,16384")
    parser.add_argument("--shape", default="shakespeare_char", choices=[s for s in SHAPES if s != "marian_small"])
    parser.add_argument("--batch_size", type=int, default=1)
    parser.add_argument("--max_gb", type=float, default=8.0, help="skip running a case XLA puts above this")
    parser.add_argument("--attention", default="auto", help="model.attention_impl (blockwise: txjax.model.blockwise)")
    parser.add_argument("--steps", type=int, default=2, help="steps per case; tokens/s is the last one's")
    parser.add_argument("--remat", default="false,true", help="comma-separated model.remat values")
    parser.add_argument("--sequence", default="1", help="comma-separated mesh.sequence values (ring attention)")
    parser.add_argument("--out", help="JSON path (default benchmarks/results/memory[_SHAPE_ATTENTION]_PLATFORM.json)")
    parser.add_argument("--case", help=argparse.SUPPRESS)  # internal: one case, JSON on stdout
    args = parser.parse_args()
    if args.case:
        print(json.dumps(case(args.shape, *json.loads(args.case))))
        return
    common.warn_if_loaded()
    rows = []
    cases = [
        (context, remat, sequence)
        for context in map(int, args.contexts.split(","))
        for remat in (flag == "true" for flag in args.remat.split(","))
        for sequence in map(int, args.sequence.split(","))
    ]
    for context, remat, sequence in cases:
        overrides = [
            f"--config.model.attention_impl={args.attention}",
            f"--config.model.max_len={context}",
            f"--config.data.seq_len={context}",
            f"--config.model.remat={remat}",
            f"--config.train.batch_size={args.batch_size}",
            "--config.model.scan_layers=true",
            f"--config.mesh.sequence={sequence}",
        ]
        devices = f"--xla_force_host_platform_device_count={sequence}"  # a CPU's simulated devices; else no effect
        child = subprocess.run(
            [
                sys.executable,
                __file__,
                f"--shape={args.shape}",
                f"--case={json.dumps([overrides, args.max_gb, args.steps])}",
            ],
            capture_output=True,
            text=True,
            env={
                **common.os.environ,
                "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
                "XLA_FLAGS": f"{common.os.environ.get('XLA_FLAGS', '')} {devices}".strip(),
            },
        )
        result = (
            json.loads(child.stdout.splitlines()[-1])
            if child.returncode == 0
            else {"error": (child.stderr.strip().splitlines() or [f"exit {child.returncode}"])[-1][:120]}
        )
        rows.append({"context": context, "remat": remat, "sequence": sequence, **result})
        print(common.table(rows[-1:]), flush=True)
    print(
        common.table(
            rows, ["context", "remat", "sequence", "peak_gb", "base_gb", "xla_estimate_gb", "tokens_per_s", "error"]
        )
    )
    payload = {"shape": args.shape, "batch_size": args.batch_size, "attention": args.attention, "rows": rows}
    if args.attention == "blockwise":
        payload["gb_per_1k_tokens"] = {str(remat): slope(rows, remat) for remat in {r["remat"] for r in rows}}
        print(f"peak memory against context, GB per 1k tokens (remat: slope): {payload['gb_per_1k_tokens']}")
    name = (
        "memory"
        if (args.shape, args.attention) == ("shakespeare_char", "auto")
        else f"memory_{args.shape}_{args.attention}"
    ) + ("_sequence" if args.sequence != "1" else "")
    print(f"wrote {common.save(name, payload, args.out)}")


def slope(rows: list[dict], remat: bool) -> dict:
    """The least-squares line peak = a + b * context of one remat setting, through the measured peaks where at
    least two cases ran, else through XLA's figures; b in GB per 1k tokens. One device's cases only."""
    rows = [r for r in rows if r["remat"] == remat and r.get("sequence", 1) == 1 and "error" not in r]
    measured = [r for r in rows if r.get("peak_gb") is not None]
    key, rows = ("peak_gb", measured) if len(measured) >= 2 else ("xla_estimate_gb", rows)
    if len(rows) < 2:
        return {}
    x = [r["context"] / 1024 for r in rows]
    y = [r[key] for r in rows]
    mx, my = sum(x) / len(x), sum(y) / len(y)
    b = sum((xi - mx) * (yi - my) for xi, yi in zip(x, y)) / sum((xi - mx) ** 2 for xi in x)
    worst = max(abs(yi - (my + b * (xi - mx))) for xi, yi in zip(x, y))
    return {"of": key, "gb_per_1k": b, "intercept_gb": my - b * mx, "largest_residual_gb": worst}


if __name__ == "__main__":
    main()
