"""The model's execution variants give the same model: layers stacked or not, scan == loop, remat, fused == reference
attention, bfloat16 compute close to float32, sown attention weights."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_attention import random_params
from test_models import KV, NL, D, H, _arange, _seq, built, make_cfg

from txjax.model.models import DecoderLM, EncoderDecoder, stack_layers, unstack_layers


def test_stack_unstack_round_trip():
    lm = built("lm", positional="rope")
    looped = unstack_layers(lm.params)
    assert "layers" not in looped["decoder"] and set(looped["decoder"]) == {"layers_0", "layers_1", "final_norm"}
    assert looped["decoder"]["layers_1"]["self_attention"]["query"].shape == (D, H, D // H)
    back = stack_layers(looped)
    jax.tree_util.tree_map(np.testing.assert_array_equal, back, lm.params)


@pytest.mark.parametrize("positional", ["rope"])
def test_scan_equals_loop(positional):
    rng = np.random.default_rng(6)
    lm = built("lm", positional=positional)
    loop = DecoderLM(make_cfg(positional=positional, scan_layers=False))
    toks = _seq(rng, 2, 8)
    loop_params = unstack_layers(lm.params)
    init_shapes = jax.eval_shape(lambda: nn.meta.unbox(loop.init(jax.random.key(0), toks)["params"]))
    assert jax.tree_util.tree_structure(init_shapes) == jax.tree_util.tree_structure(loop_params)
    expected = lm.forward(lm.params, toks, _arange(2, 8), jnp.ones((2, 8), jnp.int32))
    np.testing.assert_allclose(jax.jit(loop.apply)({"params": loop_params}, toks), expected, atol=1e-5)
    # encoder-decoder: both stacks
    s2s = built("ed", positional=positional)
    ed_loop = EncoderDecoder(make_cfg(positional=positional, scan_layers=False))
    src, tgt = _seq(rng, 2, 6), _seq(rng, 2, 6)
    src_seg = jnp.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    exp = s2s.forward(s2s.params, src, tgt, src_seg, jnp.ones((2, 6), jnp.int32))
    got = jax.jit(lambda p: ed_loop.apply({"params": p}, src, tgt, src_segment_ids=src_seg))(unstack_layers(s2s.params))
    np.testing.assert_allclose(got, exp, atol=1e-5)


def test_remat_same_outputs_and_gradients():
    """Every model.remat policy computes the loss and gradients of no remat (only what the backward pass keeps
    differs); true reads as full."""
    cfg = make_cfg(positional="rope")
    toks = _seq(np.random.default_rng(7), 2, 6)
    params = random_params(DecoderLM(cfg), toks)

    def value_and_grad(model, p):
        loss = lambda p: jnp.mean(jax.nn.log_softmax(model.apply({"params": p}, toks))[..., 0])
        return jax.jit(jax.value_and_grad(loss))(p)

    l0, g0 = value_and_grad(DecoderLM(cfg), params)
    assert (
        dataclasses.replace(cfg, remat=True).remat == "full" and dataclasses.replace(cfg, remat="false").remat == "none"
    )
    policies = [("full", True), ("full", False), ("dots_saveable", True), ("dots_with_no_batch_dims_saveable", True)]
    for policy, scan in policies + [("offload", True)]:  # under nn.scan, and each looped layer (prevent_cse)
        remat = DecoderLM(dataclasses.replace(cfg, remat=policy, scan_layers=scan))
        l1, g1 = value_and_grad(remat, params if scan else unstack_layers(params))
        np.testing.assert_allclose(l1, l0, rtol=1e-6)
        jax.tree_util.tree_map(
            lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), g1 if scan else stack_layers(g1), g0
        )


@pytest.mark.gpu
@pytest.mark.parametrize("positional", ["alibi"])
def test_fused_equals_reference_models(positional):
    rng = np.random.default_rng(8)
    lm = built("lm", positional=positional)
    fused = DecoderLM(make_cfg(positional=positional, attention_impl="fused"))
    toks = _seq(rng, 2, 8)
    seg = jnp.array([[1, 1, 1, 2, 2, 2, 2, 0], [1, 1, 1, 1, 1, 0, 0, 0]])
    pos = jnp.array([[0, 1, 2, 0, 1, 2, 3, 0], [0, 1, 2, 3, 4, 0, 0, 0]])
    ref = lm.forward(lm.params, toks, pos, seg)
    got = jax.jit(lambda p: fused.apply({"params": p}, toks, pos, seg))(lm.params)
    np.testing.assert_allclose(got, ref, atol=1e-4)
    s2s = built("ed", positional=positional)
    ed_fused = EncoderDecoder(make_cfg(positional=positional, attention_impl="fused"))
    src, tgt = _seq(rng, 2, 6), _seq(rng, 2, 6)
    src_seg = jnp.array([[1, 1, 1, 0, 0, 0], [1, 1, 2, 2, 2, 2]])  # padded row; packed row (2 pairs)
    tgt_seg = jnp.array([[1, 1, 0, 0, 0, 0], [1, 1, 1, 2, 2, 2]])
    exp = s2s.forward(s2s.params, src, tgt, src_seg, tgt_seg)
    got = jax.jit(lambda p: ed_fused.apply({"params": p}, src, tgt, src_segment_ids=src_seg, tgt_segment_ids=tgt_seg))(
        s2s.params
    )
    np.testing.assert_allclose(got, exp, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["reference", "fused"])
def test_bfloat16_compute_close_to_float32_params_stay_float32(impl):
    lm = built("lm", positional="alibi")
    bf = DecoderLM(make_cfg(positional="alibi", dtype="bfloat16", attention_impl=impl))
    toks = _seq(np.random.default_rng(9), 2, 8)
    shapes = jax.eval_shape(lambda: bf.init(jax.random.key(0), toks)["params"])
    assert all(l.dtype == jnp.float32 for l in jax.tree_util.tree_leaves(nn.meta.unbox(shapes)))
    ref = lm.forward(lm.params, toks, _arange(2, 8), jnp.ones((2, 8), jnp.int32))
    got = jax.jit(lambda p: bf.apply({"params": p}, toks))(lm.params)
    assert got.dtype == jnp.float32 and np.isfinite(np.asarray(got)).all()
    scale = float(jnp.abs(ref).max())
    assert float(jnp.abs(got - ref).max()) < 0.05 * scale + 0.05
    assert float(jnp.abs(got - ref).max()) > 0  # it did compute in bfloat16


@pytest.mark.gpu
def test_bfloat16_grouped_query_attention_gradients_close_to_float32():
    """The backward pass of grouped-query attention runs in bfloat16 (on XLA:CPU, whose bfloat16 dots take two batch
    axes and GQA's backward has three, the attention itself computes in float32) and its gradients are float32's
    within bfloat16's precision."""
    assert KV < H
    toks = _seq(np.random.default_rng(11), 4, 16)
    cfg = dict(positional="rope", d_model=64, d_ff=64, num_layers=1)  # d_k 16: dots too small are rewritten
    params = random_params(DecoderLM(make_cfg(**cfg)), toks)

    def grads(dtype):
        model = DecoderLM(make_cfg(**cfg, dtype=dtype))
        logp = lambda p: jax.nn.log_softmax(model.apply({"params": p}, toks[:, :-1]))
        nll = lambda p: -jnp.take_along_axis(logp(p), toks[:, 1:, None], axis=-1).mean()
        return jax.jit(jax.grad(nll))(params)

    for ref, got in zip(jax.tree_util.tree_leaves(grads("float32")), jax.tree_util.tree_leaves(grads("bfloat16"))):
        assert got.dtype == jnp.float32 and np.isfinite(np.asarray(got)).all()
        assert float(jnp.linalg.norm(got - ref)) <= 0.05 * float(jnp.linalg.norm(ref)) + 1e-6


def test_sown_attention_weights_per_layer():
    cfg = make_cfg(positional="rope")
    model = DecoderLM(cfg, sow_weights=True)
    toks = _seq(np.random.default_rng(10), 2, 5)
    seg = jnp.array([[1, 1, 2, 2, 0], [1, 1, 1, 1, 1]])
    pos = jnp.array([[0, 1, 0, 1, 0], [0, 1, 2, 3, 4]])
    _, inter = jax.jit(lambda p: model.apply({"params": p}, toks, pos, seg, mutable=["intermediates"]))(
        built("lm", positional="rope").params
    )
    (w,) = inter["intermediates"]["decoder"]["layers"]["self_attention"]["attention_weights"]
    assert w.shape == (NL, 2, H, 5, 5)
    w = np.asarray(w)
    np.testing.assert_allclose(w[:, 0, :, :4].sum(-1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(w[:, 0, :, 4], 0.0)  # the pad query attends to nothing
    np.testing.assert_array_equal(w[:, 0, :, 2:4, :2], 0.0)  # segment 2 does not see segment 1
    np.testing.assert_array_equal(w[:, 1][..., np.triu_indices(5, 1)[0], np.triu_indices(5, 1)[1]], 0.0)  # causal
