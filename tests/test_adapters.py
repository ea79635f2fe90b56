"""LoRA's adapters inside the model (txjax.model.adapters). Merged block by block, as the train step runs them,
against the whole tree merged before the model runs (txjax.state.lora.model_params, what evaluation reads; its
W + s A B is checked against NumPy in tests/test_lora.py): the same logits, multi-token predictions and MoE
statistics, and the same gradient of the adapters, on a tiny scanned stack of Groups (a dense block, then an MoE
block) with an MTP module's block. With train.lora_dropout: y = x W + s drop(x) A B against NumPy, the masks read
back from the same rng; the model's projections with masks that keep everything equal the merged model; dropout
changes the adapters' gradient; the weights it cannot reach are refused in one line."""

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txjax.errors import ConfigError
from txjax.families import init_params, param_roles
from txjax.families.objective import forward
from txjax.model import adapters
from txjax.model.config import ModelConfig
from txjax.model.models import DecoderLM
from txjax.state import lora
from txjax.state.optim import OptimConfig
from txjax.state.train_state import optimizer, start_state

VOCAB, B, L = 48, 2, 8
CFG = ModelConfig(
    vocab_size=VOCAB, d_model=16, num_heads=2, num_kv_heads=1, d_ff=32, num_layers=2, max_len=L, num_experts=2,
    moe_every=2, mtp_depth=1, tie_embeddings=False,
)  # fmt: skip
LORA = lora.LoraConfig(lora_rank=2, lora_alpha=3.0)  # s = 1.5: not a power of two, so where it is applied shows


DENSE = dataclasses.replace(CFG, num_experts=0, moe_every=1)  # the weights lora_dropout reaches


@functools.cache
def adapted_and_batch(cfg=CFG):
    model = DecoderLM(cfg)
    tx = optimizer(model, OptimConfig(), LORA)
    params = jax.jit(lambda: start_state(init_params(model, jax.random.key(0)), tx, model, 0, LORA))().params
    # B = 0 at init would hide the adapters: draw them all
    leaves, tree = jax.tree_util.tree_flatten(params.lora)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    params = params.replace(lora=tree.unflatten([0.3 * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)]))
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, VOCAB, (B, L + 1), dtype=np.int32)
    ones = np.ones((B, L), np.int32)
    batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "weights": ones.astype(np.float32)}
    batch |= {"positions": np.broadcast_to(np.arange(L, dtype=np.int32), (B, L)), "segment_ids": ones}
    return model, params, batch


def _outputs(model, trained, params, batch, per_block: bool, rate=0.0):
    """(a scalar of every output, the outputs): logits, MTP logits and MoE statistics; per block with dropout
    `rate` on the adapters' inputs, or the whole tree merged."""
    params = params.replace(lora=trained)
    if per_block:
        base, adapted = lora.base_and_adapters(params)
        with adapters.dropout(rate):
            logits, _, _, stats, depths = forward(model, base, batch, jax.random.key(5) if rate else None, adapted)
    else:
        logits, _, _, stats, depths = forward(model, lora.model_params(params), batch)
    outs = (logits, [d[0] for d in depths], stats)
    total = sum(jnp.sum(jnp.sin(x)) for x in jax.tree.leaves(outs) if jnp.issubdtype(x.dtype, jnp.floating))
    return total, outs


@functools.cache
def run(cfg=CFG, per_block=True, rate=0.0):
    model, params, batch = adapted_and_batch(cfg)
    grad = jax.value_and_grad(functools.partial(_outputs, model, per_block=per_block, rate=rate), has_aux=True)
    return jax.jit(grad)(params.lora, params, batch)


def both():
    return run(CFG, True), run(CFG, False)


def test_the_blocks_merge_every_adapter_as_the_whole_tree_does():
    ((_, per_block), _), ((_, whole), _) = both()
    assert jax.tree.structure(per_block) == jax.tree.structure(whole)
    assert len(per_block[1]) == 1 and per_block[2]  # an MTP depth and MoE statistics: their blocks ran
    for a, b in zip(jax.tree.leaves(per_block), jax.tree.leaves(whole)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_the_adapters_gradient_is_the_whole_trees():
    (_, per_block), (_, whole) = both()
    flat = jax.tree_util.tree_flatten_with_path(per_block)[0]
    assert {p[-1].key for p, _ in flat} == {"a", "b"} and len(flat) > 8  # attention's, the FFN's, the experts'
    for (path, a), b in zip(flat, jax.tree.leaves(whole)):
        assert np.abs(a).max() > 0, path  # every adapter reaches the outputs
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=str(path))


class Projection(nn.Module):
    """y = x W through adapters.low_rank, as the model's projections call it."""

    @nn.compact
    def __call__(self, x_NxI):
        w = self.param("w", nn.initializers.normal(1.0), (x_NxI.shape[-1], 16))
        return x_NxI @ w, adapters.low_rank(self, ("w",), x_NxI, x_NxI @ w, inputs=1)


def test_lora_dropout_is_x_w_plus_the_dropped_inputs_low_rank_term_in_numpy():
    rate, scale, x = 0.25, 1.5, np.random.default_rng(1).normal(size=(64, 16)).astype(np.float32)
    w = Projection().init(jax.random.key(0), x)["params"]
    apply = lambda a, b: Projection().apply(
        {"params": w, adapters.COLLECTION: {"w": {"a": a, "b": scale * b}}}, x, rngs={"dropout": jax.random.key(3)}
    )
    with adapters.dropout(rate):
        xw, y = apply(np.eye(16, dtype=np.float32), np.eye(16, dtype=np.float32) / scale)  # y - x W = drop(x)
        keep = np.asarray(y - xw) != 0
        assert 0.6 < keep.mean() < 0.9 and np.allclose(
            np.asarray(y - xw)[keep], x[keep] / (1 - rate), rtol=1e-4, atol=1e-5
        )
        rng = np.random.default_rng(2)
        a, b = rng.normal(size=(16, 4)).astype(np.float32), rng.normal(size=(4, 16)).astype(np.float32)
        xw, y = apply(a, b)
    np.testing.assert_allclose(y, xw + scale * ((keep * x / (1 - rate)) @ a) @ b, rtol=1e-4, atol=1e-4)


def test_projections_keeping_every_input_are_the_merged_model():
    (_, dropped), grads = run(DENSE, True, 1e-9)  # every mask keeps all: x W + x A (s B) in every projection
    (_, merged), merged_grads = run(DENSE, False)
    for a, b in zip(jax.tree.leaves((dropped, grads)), jax.tree.leaves((merged, merged_grads))):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_lora_dropout_changes_the_adapters_gradient():
    (_, dropped), grads = run(DENSE, True, 0.5)
    (_, merged), merged_grads = run(DENSE, False)
    assert not np.allclose(dropped[0], merged[0], atol=1e-3)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(merged_grads)):
        assert not np.allclose(a, b, atol=1e-4)


def test_lora_dropout_on_weights_it_cannot_reach_is_one_line():
    roles = param_roles(DecoderLM(CFG))  # the MoE block's experts
    with pytest.raises(ConfigError, match=r"lora_dropout=0.1 .* not of decoder/layers/block_1/ffn/experts/wi "):
        lora.targeted(roles, dataclasses.replace(LORA, lora_dropout=0.1))
    assert lora.targeted(roles, dataclasses.replace(LORA, lora_dropout=0.1, lora_targets=("query", "out")))
