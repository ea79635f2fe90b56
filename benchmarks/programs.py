"""The compiled training, decoding and lm-eval programs as fingerprints: a refactor that keeps them keeps every speed
figure.

    python benchmarks/programs.py [--shape=shakespeare_char] [--out=results/programs_PLATFORM.json]

For each program, the optimized HLO text XLA compiles (metadata, source locations and stack frames left out), its
instruction count and sha256:
- generate_FLOAT: txjax.decode.generate_ids, greedy, 256 new tokens from a 1-token prompt, batch 1, the model in
  decoding's layout (for_decoding) in float32 and bfloat16;
- lm_eval_score: txjax.evaluate.lm_eval_model.make_score over 2 rows of 32 tokens, 16 scored positions (a tiny LM);
- train_IMPL: txjax.training.step.make_train_step of benchmarks/train.py's shape (its batch of random tokens), the
  reference and the blockwise attention (which ring attention shares).
Run it in two checkouts (the script copied into the other's benchmarks/): equal hashes mean the same machine code
runs, so their speeds are equal by construction, whatever load the shared cores carried while timing them
(benchmarks/decode.py and train.py time them).
"""

from __future__ import annotations

import argparse
import hashlib
import re

import common
import flax.linen as nn
import jax
import jax.numpy as jnp
from decode import SHAPES, build
from train import build_config, lm_batches

from txjax import decode
from txjax.experiment import build_model
from txjax.families import param_roles
from txjax.model.config import ModelConfig
from txjax.model.models import DecoderLM
from txjax.sections.train import TrainConfig
from txjax.state.optim import OptimConfig, make_optimizer
from txjax.state.train_state import init_state
from txjax.training.step import make_train_step


def instructions(compiled) -> list[str]:
    """The HLO instructions of a compiled program, without metadata and stack frame ids (paths, line numbers)."""
    text = re.sub(r", metadata=\{[^}]*\}", "", compiled.as_text())
    lines = [line for line in text.splitlines() if re.match(r"^\s*(ROOT )?%|^\s*\S+ = |^(ENTRY )?%", line)]
    return [re.sub(r",? ?stack_frame_id=\d+", "", line) for line in lines]


def fingerprint(compiled) -> dict:
    lines = instructions(compiled)
    return {"instructions": len(lines), "sha256": hashlib.sha256("\n".join(lines).encode()).hexdigest()}


def generate_program(shape: str, dtype: str):
    model, params = build(shape, dtype)
    strategy = decode.Strategy(max_new_tokens=256)
    prompt_1x1, lengths_1 = jnp.zeros((1, 1), jnp.int32), jnp.ones((1,), jnp.int32)
    args = (model, params, strategy, 0, prompt_1x1, lengths_1, None, jax.random.key(0))
    return decode.generate_ids.lower(*args).compile()


def score_program():
    from txjax.evaluate.lm_eval_model import make_score

    model = DecoderLM(ModelConfig(vocab_size=65, d_model=32, num_heads=4, d_ff=64, num_layers=2, max_len=64))
    params = nn.meta.unbox(jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 4), jnp.int32))["params"])
    ids_2x32, scored_2x16 = jnp.zeros((2, 32), jnp.int32), jnp.zeros((2, 16), jnp.int32)
    args = (ids_2x32,) * 4 + (scored_2x16, scored_2x16, jnp.zeros((2, 16), jnp.float32))
    return make_score(model).lower(params, *args).compile()


def train_program(shape: str, impl: str):
    config = build_config(shape, [f"--config.model.attention_impl={impl}"])
    model = build_model(config)
    tx = make_optimizer(OptimConfig.of(config.train), param_roles(model))
    state = jax.eval_shape(lambda: init_state(model, tx, config.train.seed))
    return make_train_step(model, tx, TrainConfig.of(config.train)).lower(state, lm_batches(config, 1)[0]).compile()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=tuple(SHAPES), default="shakespeare_char")
    parser.add_argument("--out")
    args = parser.parse_args()
    programs = {f"generate_{dtype}": generate_program(args.shape, dtype) for dtype in ("float32", "bfloat16")}
    programs["lm_eval_score"] = score_program()
    programs |= {f"train_{impl}": train_program(args.shape, impl) for impl in ("reference", "blockwise")}
    rows = [{"program": name, **fingerprint(compiled)} for name, compiled in programs.items()]
    print(common.table(rows))
    print(f"wrote {common.save('programs', {'shape': args.shape, 'programs': rows}, args.out)}")


if __name__ == "__main__":
    main()
