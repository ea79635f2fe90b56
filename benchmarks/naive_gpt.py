"""The baseline of issue 6: a plain Flax Linen GPT of the shakespeare_char shape, written the obvious way.

    python benchmarks/naive_gpt.py [--steps=100]

4 layers, 4 heads, d_model 128, context 64, batch 12, vocabulary 65, float32, nn.Dense projections, tanh GELU,
learned positions, tied head, optax.adamw, one jitted step with no donation. What txjax's own step
(`benchmarks/train.py --shape=shakespeare_char`) is compared with: ms/step median after 5 warm-up steps.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import common  # noqa: F401  (puts the repo on sys.path)
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

V, D, H, L, T, B = 65, 128, 4, 4, 64, 12


class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
        q, k, v = jnp.split(nn.Dense(3 * D, use_bias=False)(nn.LayerNorm()(x)), 3, axis=-1)
        q, k, v = (t.reshape(B, T, H, D // H) for t in (q, k, v))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(D // H)
        scores = jnp.where(jnp.tril(jnp.ones((T, T), bool)), scores, -1e9)
        attended = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, -1), v).reshape(B, T, D)
        x = x + nn.Dense(D, use_bias=False)(attended)
        return x + nn.Dense(D, use_bias=False)(nn.gelu(nn.Dense(4 * D, use_bias=False)(nn.LayerNorm()(x))))


class GPT(nn.Module):
    @nn.compact
    def __call__(self, tokens):
        embed = nn.Embed(V, D)
        x = embed(tokens) + self.param("pos", nn.initializers.normal(0.02), (T, D))
        for _ in range(L):
            x = Block()(x)
        return embed.attend(nn.LayerNorm()(x))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    common.warn_if_loaded()
    model, tx = GPT(), optax.adamw(1e-3)
    rng = np.random.default_rng(0)
    batches = [jnp.asarray(rng.integers(0, V, (B, T)), jnp.int32) for _ in range(4)]
    params = model.init(jax.random.key(0), batches[0])
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state, x, y):
        loss_fn = lambda p: optax.softmax_cross_entropy_with_integer_labels(model.apply(p, x), y).mean()
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    times = []
    for i in range(args.steps + 5):
        began = time.perf_counter()
        params, opt_state, loss = step(params, opt_state, batches[i % 4], batches[(i + 1) % 4])
        loss.block_until_ready()
        if i >= 5:
            times.append(time.perf_counter() - began)
    ms = 1e3 * statistics.median(times)
    print(
        json.dumps(
            {"benchmark": "naive_gpt", "ms_per_step": ms, "min_ms": 1e3 * min(times), "tokens_per_s": B * T / ms * 1e3}
        )
    )


if __name__ == "__main__":
    main()
