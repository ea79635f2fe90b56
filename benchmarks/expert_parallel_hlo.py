"""The collectives XLA compiles for an MoE layer on an expert-parallel mesh: shard_map with all-to-all (what txjax
runs, txjax.parallel.expert_parallel) against the same one-device code laid out by sharding annotations alone.

    python benchmarks/expert_parallel_hlo.py [--experts=8] [--expert_axis=4] [--tokens=512] [--d_model=64]

Both programs are the gradient of a loss of the layer's output (dropless, 8 experts top-2), jitted with the experts'
weights split along the `expert` axis and the rows of the batch along the batch axes (data x fsdp x expert), on
`expert_axis` simulated CPU devices; for each the count of every collective in the optimized HLO and the shapes of
the all-gathers. Writes results/expert_parallel_hlo_PLATFORM.json.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from unittest import mock

if __name__ == "__main__":  # the simulated devices, before jax starts (no effect on an accelerator's devices)
    count = next((a.split("=")[1] for a in sys.argv if a.startswith("--expert_axis=")), "4")
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={count}"

import common  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from txjax.model.config import ModelConfig  # noqa: E402
from txjax.model.moe import MoE  # noqa: E402
from txjax.parallel import expert_parallel  # noqa: E402
from txjax.parallel.sharding import batch_sharding, make_mesh, on_mesh, shardings_for  # noqa: E402

COLLECTIVES = ("all-to-all", "all-gather", "all-reduce", "reduce-scatter", "collective-permute")


def collectives(hlo: str) -> dict:
    """{collective: count} and the result shapes of the all-gathers, from optimized HLO text."""
    counts = {name: len(re.findall(rf"= [^=]*? {name}(-start)?\(", hlo)) for name in COLLECTIVES}
    gathered = sorted(set(re.findall(r"= (\w+\[[\d,]*\])[^=]*? all-gather(?:-start)?\(", hlo)))
    return {**counts, "all_gather_shapes": gathered}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--expert_axis", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=512, help="batch rows x 64 positions")
    parser.add_argument("--d_model", type=int, default=64)
    parser.add_argument("--out", help="JSON path (default benchmarks/results/expert_parallel_hlo_PLATFORM.json)")
    args = parser.parse_args()
    d = args.d_model
    cfg = ModelConfig(
        vocab_size=8, max_len=64, d_model=d, num_heads=2, d_ff=2 * d, num_layers=1, num_experts=args.experts,
        experts_per_token=2, use_bias=False, dtype="float32",
    )  # fmt: skip
    layer = MoE(cfg)
    x_BxLxD = jnp.zeros((args.tokens // 64, 64, d))
    mesh = make_mesh(expert=args.expert_axis, devices=jax.devices()[: args.expert_axis])
    param_shardings = shardings_for(jax.eval_shape(layer.init, jax.random.key(0), x_BxLxD)["params"], mesh)
    params = jax.eval_shape(layer.init, jax.random.key(0), x_BxLxD)["params"]

    def compiled_hlo() -> str:  # traced anew each call (a new function: jit's cache does not apply)
        loss = lambda p, x: jnp.sum(layer.apply({"params": p}, x, mutable=["moe"])[0] * x)
        step = jax.jit(on_mesh(jax.grad(loss), mesh), in_shardings=(param_shardings, batch_sharding(mesh)))
        return step.lower(params, x_BxLxD).compile().as_text()

    rows = {"shard_map + all_to_all (txjax)": collectives(compiled_hlo())}
    with mock.patch.object(expert_parallel, "applies", lambda *_: False):  # the one-device code, annotated only
        rows["sharding annotations only"] = collectives(compiled_hlo())
    for name, row in rows.items():
        print(f"{name}: {', '.join(f'{c} {row[c]}' for c in COLLECTIVES)}; all-gathers of {row['all_gather_shapes']}")
    path = common.save("expert_parallel_hlo", {"config": vars(args), "programs": rows}, args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
