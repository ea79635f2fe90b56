"""Self-speculative greedy decoding (txjax.decode.speculative, the MTP modules drafting) against plain greedy
decoding on the same model: tokens/s, batch 1, an 8-token prompt, no stop token (both generate exactly N tokens,
asserted equal), for two sets of weights of one shape (8 layers, d_model 128, mtp_depth 2):

    agreeing  the modules compute what the model computes (layer 0 a random layer without attention, the 7 after it
              identities but for their attention's output, random x `noise`; each module's block layer 0, its
              projection [I; 0], embeddings of RMS 1): drafts mostly accepted, the best case of a well-trained head
    random    random weights: drafts nearly all refused, the cost of drafting for nothing

    python benchmarks/speculative.py [--new_tokens=128] [--repeats=5] [--noise=0.3] [--out=PATH]

After one untimed run of each (compilation), the two are timed alternately `repeats` times; medians of wall seconds.
"""

from __future__ import annotations

import argparse
import statistics
import time

import common
import jax
import jax.numpy as jnp

from txjax.decode import generate
from txjax.families import init_params
from txjax.model.config import ModelConfig
from txjax.model.models import DecoderLM

CFG = ModelConfig(
    vocab_size=256, d_model=128, num_heads=4, d_ff=512, num_layers=8, max_len=512, positional="rope", norm="rmsnorm",
    mtp_depth=2,
)  # fmt: skip


def weights(cfg: ModelConfig, kind: str, noise: float, scale: float = 3.0):
    """Random weights times `scale` (sharp logits: no near ties between two programs' roundings), and for `agreeing`
    modules that compute what the model computes one token on: embeddings of RMS 1 (which the modules' input norm
    leaves as they are), each module's projection [I; 0] (the token's embedding alone) and block the model's first
    layer without attention; the model's layers after it identities but for their attention's output, and every
    layer's attention output random x `noise` (0: each next token a function of the last one alone)."""
    params = jax.tree.map(lambda a: a * scale if a.ndim >= 2 else a, init_params(DecoderLM(cfg), jax.random.key(0)))
    if kind == "random":
        return params
    embedding = params["embed"]["tokens"]["embedding"]
    params["embed"]["tokens"]["embedding"] = embedding / jnp.sqrt(jnp.mean(embedding**2, -1, keepdims=True))
    layers = params["decoder"]["layers"]
    first = jax.tree.map(lambda a: a[0], layers)
    first["self_attention"]["out"] = jnp.zeros_like(first["self_attention"]["out"])
    for depth in params["mtp"].values():
        depth["block"] = first
        depth["proj"]["kernel"] = jnp.concatenate([jnp.eye(cfg.d_model), jnp.zeros((cfg.d_model,) * 2)])
    out = layers["self_attention"]["out"]
    layers["self_attention"]["out"] = noise * jax.random.normal(jax.random.key(1), out.shape) / scale
    layers["ffn"]["wo"]["kernel"] = layers["ffn"]["wo"]["kernel"].at[1:].set(0.0)
    return params


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--new_tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--noise", type=float, default=0.3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    common.warn_if_loaded()
    model, prompt, rows = DecoderLM(CFG), [[5, 17, 42, 9, 200, 3, 77, 120]], []
    for kind in ("agreeing", "random"):
        params = weights(CFG, kind, args.noise)
        ways = {
            "greedy": lambda p=params: generate(model, p, prompt, max_new_tokens=args.new_tokens),
            "speculative": lambda p=params: generate(
                model, p, prompt, max_new_tokens=args.new_tokens, speculative=True
            ),
        }
        outs = {name: fn() for name, fn in ways.items()}  # compiles
        assert outs["greedy"].ids == outs["speculative"].ids, outs
        times = {name: [] for name in ways}
        for _ in range(args.repeats):
            for name, fn in ways.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
        row = {"weights": kind, "new_tokens": args.new_tokens}
        row |= {f"{name}_tokens_per_s": args.new_tokens / statistics.median(t) for name, t in times.items()}
        row["speedup"] = row["speculative_tokens_per_s"] / row["greedy_tokens_per_s"]
        row["drafts_accepted"] = outs["speculative"].accepted / (outs["speculative"].steps * CFG.mtp_depth)
        row["tokens_per_call"] = (args.new_tokens - 1) / outs["speculative"].steps
        rows.append(row)
    print(common.table(rows))
    shape = {"d_model": CFG.d_model, "num_layers": CFG.num_layers, "mtp_depth": CFG.mtp_depth, "noise": args.noise}
    path = common.save("speculative", {"shape": shape, "results": rows}, args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
