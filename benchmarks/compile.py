"""Compile time of txjax's train_step against depth: layers stacked with nn.scan versus a Python loop.

    python benchmarks/compile.py [--layers=2,12,48] [--shape=shakespeare_char]

For each depth and stacking, the real train_step (txjax.training.step.make_train_step) is traced and lowered
('trace_s')
and compiled by XLA ('compile_s') from abstract shapes only (nothing is allocated or run). A scanned stack
compiles one layer body whatever the depth, so its time should stay roughly flat; the loop's grows with depth.
XLA_FLAGS from the environment apply and are recorded, e.g. the test suite's code generation (tests/conftest.py):

    XLA_FLAGS="--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false" python benchmarks/compile.py
"""

from __future__ import annotations

import argparse
import os
import time

import common
import jax
from train import SHAPES, build_config, lm_batches

from txjax.experiment import build_model
from txjax.families import param_roles
from txjax.sections.train import TrainConfig
from txjax.state.optim import OptimConfig, make_optimizer
from txjax.state.train_state import init_state
from txjax.training.step import make_train_step


def compile_seconds(config) -> dict:
    """Seconds to trace+lower and to compile the train step of `config` (a fresh jit each time)."""
    model = build_model(config)
    tx = make_optimizer(OptimConfig.of(config.train), param_roles(model))
    state = jax.eval_shape(lambda: init_state(model, tx, config.train.seed))
    batch = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), lm_batches(config, 1)[0])
    start = time.perf_counter()
    lowered = make_train_step(model, tx, TrainConfig.of(config.train)).lower(state, batch)
    traced = time.perf_counter()
    lowered.compile()
    return {"trace_s": traced - start, "compile_s": time.perf_counter() - traced}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", default="2,12,48", help="comma-separated depths")
    parser.add_argument("--shape", default="shakespeare_char", choices=[s for s in SHAPES if s != "marian_small"])
    parser.add_argument("--out", help="JSON path (default benchmarks/results/compile_PLATFORM.json)")
    args = parser.parse_args()
    common.warn_if_loaded()
    rows = []
    for layers in map(int, args.layers.split(",")):
        for scan in (True, False):
            config = build_config(
                args.shape, [f"--config.model.num_layers={layers}", f"--config.model.scan_layers={scan}"]
            )
            rows.append({"layers": layers, "stack": "scan" if scan else "loop", **compile_seconds(config)})
            rows[-1]["total_s"] = rows[-1]["trace_s"] + rows[-1]["compile_s"]
            print(common.table(rows[-1:]), flush=True)
    print(common.table(rows))
    payload = {"shape": args.shape, "xla_flags": os.environ.get("XLA_FLAGS", ""), "rows": rows}
    print(f"wrote {common.save('compile', payload, args.out)}")


if __name__ == "__main__":
    main()
