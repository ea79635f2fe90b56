"""LoRA's adapters merged block by block (txjax.model.adapters), as the train step runs them, against the whole tree
merged before the model runs (txjax.state.lora.model_params, what evaluation reads; its W + s A B is checked against
NumPy in tests/test_lora.py): the same logits, multi-token predictions and MoE statistics, and the same gradient of
the adapters, on a tiny scanned stack of Groups (a dense block, then an MoE block) with an MTP module's block."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from txjax.families import init_params
from txjax.families.objective import forward
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


@functools.cache
def adapted_and_batch():
    model = DecoderLM(CFG)
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


def _outputs(model, trained, params, batch, per_block: bool):
    """(a scalar of every output, the outputs): logits, MTP logits and MoE statistics."""
    params = params.replace(lora=trained)
    if per_block:
        base, adapters = lora.base_and_adapters(params)
        logits, _, _, stats, depths = forward(model, base, batch, adapters=adapters)
    else:
        logits, _, _, stats, depths = forward(model, lora.model_params(params), batch)
    outs = (logits, [d[0] for d in depths], stats)
    total = sum(jnp.sum(jnp.sin(x)) for x in jax.tree.leaves(outs) if jnp.issubdtype(x.dtype, jnp.floating))
    return total, outs


@functools.cache
def both():
    model, params, batch = adapted_and_batch()
    run = lambda per_block: jax.jit(
        jax.value_and_grad(functools.partial(_outputs, model, per_block=per_block), has_aux=True)
    )(params.lora, params, batch)
    return run(True), run(False)


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
