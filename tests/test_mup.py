"""muP (Yang et al. 2022, "Tensor Programs V", Table 8 with Adam) against the table: per-parameter learning-rate
multipliers and initial variances at two widths, the standard model at the base width, the readout's 1/m, AdamW's
per-layer learning rates against two optax AdamWs, and a first update whose size relative to the weights does not
grow with the width (it does under the standard parametrization)."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from txjax import config as config_lib
from txjax.families import init_params, param_roles
from txjax.families.objective import token_sums
from txjax.model.config import ModelConfig
from txjax.model.models import DecoderLM
from txjax.state.optim import (
    OptimConfig,
    learning_rate_at,
    make_optimizer,
    mup_lr_multipliers,
)

BASE, STD = 16, 0.02
HIDDEN = {"query", "key", "value", "out", "wi", "wo"}  # Table 8's hidden weights: both dimensions grow with width
RESIDUAL_OUT = {"out", "wo"}  # GPT-2's 1/sqrt(2 L) on the residual branches' outputs, kept under muP


def mup_config(d_model, parametrization="mup", **kw):
    return ModelConfig(
        vocab_size=11,
        d_model=d_model,
        num_heads=2,
        d_ff=4 * d_model,
        num_layers=1,
        scan_layers=False,
        max_len=8,
        tie_embeddings=False,
        attention_scale="linear",
        parametrization=parametrization,
        base_width=BASE,
        **kw,
    )


@functools.cache
def init(model):
    return jax.jit(lambda key: init_params(model, key))(jax.random.key(0, impl="unsafe_rbg"))  # compiles fast


def named_leaves(params):
    """[(the leaf's own name, or its module's for a Dense kernel; leaf)]"""
    leaves = jax.tree_util.tree_leaves_with_path(params)
    return [(p[-2].key if p[-1].key == "kernel" else p[-1].key, leaf, p) for p, leaf in leaves]


@pytest.mark.parametrize("d_model", [32, 64])
def test_multipliers_and_initial_variances_follow_table_8(d_model):
    cfg, m = mup_config(d_model), d_model / BASE
    params = init(DecoderLM(cfg))
    multipliers = mup_lr_multipliers(param_roles(DecoderLM(cfg)), cfg)
    for (name, leaf, path), mult in zip(named_leaves(params), jax.tree_util.tree_leaves(multipliers), strict=True):
        assert mult == (1 / m if name in HIDDEN else 1.0), path  # Adam LR: 1/fan_in on hidden, 1 on the rest
        if name in ("scale", "bias"):
            continue
        var = STD**2 * ((1 / m) if name in HIDDEN else 1.0) / (2 * cfg.num_layers if name in RESIDUAL_OUT else 1)
        np.testing.assert_allclose(np.var(np.asarray(leaf)), var, rtol=0.25, err_msg=str(path))


def test_at_the_base_width_mup_is_the_standard_model_and_the_readout_is_divided_by_m():
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 11, (2, 8)), jnp.int32)
    standard, mup = (DecoderLM(mup_config(BASE, p)) for p in ("standard", "mup"))
    p_std, p_mup = (init(model) for model in (standard, mup))
    for x, y in zip(jax.tree_util.tree_leaves(p_std), jax.tree_util.tree_leaves(p_mup), strict=True):
        np.testing.assert_array_equal(x, y)
    logits = jax.jit(standard.apply)({"params": p_std}, tokens)
    # exact by construction: at m = 1 muP's program is the standard one but for the readout's division by 1.0, exact
    np.testing.assert_array_equal(jax.jit(mup.apply)({"params": p_std}, tokens), logits)
    assert set(jax.tree_util.tree_leaves(mup_lr_multipliers(param_roles(mup), mup.cfg))) == {1.0}
    wide_std, wide_mup = (DecoderLM(mup_config(4 * BASE, p)) for p in ("standard", "mup"))
    params = init(wide_mup)
    np.testing.assert_allclose(
        jax.jit(wide_mup.apply)({"params": params}, tokens),
        jax.jit(wide_std.apply)({"params": params}, tokens) / 4,
        rtol=1e-6,
    )


def train_section(**kw):
    t = config_lib.base_config().train
    t.update(steps=20, warmup_steps=0, learning_rate=1e-2, **kw)
    return OptimConfig.of(t)


def test_adamw_under_mup_is_two_adamws_with_lr_and_lr_over_m():
    cfg, m = mup_config(64), 4.0
    params = init(DecoderLM(cfg))
    t = train_section(grad_clip=0.0)
    ours = make_optimizer(t, param_roles(DecoderLM(cfg)), cfg)
    schedule = lambda scale: lambda n: scale * learning_rate_at(n, t.learning_rate, 0, t.min_lr_ratio, t.steps)
    names = {path: name for name, _, path in named_leaves(params)}
    decay = jax.tree_util.tree_map_with_path(lambda p, _: names[p] not in ("scale", "bias"), params)
    adamw = lambda scale: optax.adamw(schedule(scale), b1=t.b1, b2=t.b2, weight_decay=t.weight_decay, mask=decay)
    labels = jax.tree_util.tree_map_with_path(lambda p, _: "hidden" if names[p] in HIDDEN else "vector", params)
    theirs = optax.partition({"hidden": adamw(1 / m), "vector": adamw(1.0)}, labels)
    rng = np.random.default_rng(1)
    state_a, state_b, a, b = ours.init(params), theirs.init(params), params, params
    for _ in range(3):
        g = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), params)
        ua, state_a = jax.jit(ours.update)(g, state_a, a)
        ub, state_b = jax.jit(theirs.update)(g, state_b, b)
        a, b = optax.apply_updates(a, ua), optax.apply_updates(b, ub)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)


def spectral_norm(a) -> float:
    """The largest singular value, from the eigenvalues of the smaller Gram matrix (faster than an SVD)."""
    a = np.asarray(a, np.float64)
    return float(np.sqrt(np.linalg.eigvalsh(a @ a.T if a.shape[0] <= a.shape[1] else a.T @ a)[-1]))


def first_update_ratio(cfg) -> float:
    """||dW||_2 / ||W||_2 (spectral norms) of the first FFN kernel after one AdamW step on a random batch: how much
    one step changes what the layer computes, relative to what it computed."""
    model = DecoderLM(cfg)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 11, (4, 9)), jnp.int32)
    weights = jnp.ones(tokens[:, 1:].shape)
    loss = lambda p: token_sums(model.apply({"params": p}, tokens[:, :-1]), tokens[:, 1:], weights)["loss"]
    tx = make_optimizer(train_section(), param_roles(model), cfg)
    kernel = lambda tree: tree["decoder"]["layers_0"]["ffn"]["wi"]["kernel"]

    @jax.jit
    def first_update(params):
        return kernel(tx.update(jax.grad(loss)(params), tx.init(params), params)[0]), kernel(params)

    dw, w = first_update(init(model))
    return spectral_norm(dw) / spectral_norm(w)


def test_the_first_update_relative_to_the_weights_is_width_independent_under_mup():
    """Widths 128 and 512 (m = 8 and 32): measured 0.61 and 0.55 under muP, 1.73 and 3.87 under the standard
    parametrization, whose ratio grows about as sqrt(width) (||W|| ~ sqrt(n), Adam's first step ~ n)."""
    narrow, wide = (first_update_ratio(mup_config(d)) for d in (8 * BASE, 32 * BASE))
    assert 0.8 < wide / narrow < 1.25, (narrow, wide)
    sp_narrow, sp_wide = (first_update_ratio(mup_config(d, "standard")) for d in (8 * BASE, 32 * BASE))
    assert sp_wide / sp_narrow > 1.6, (sp_narrow, sp_wide)


def test_mup_refuses_what_it_does_not_scale():
    flags = ["--config.model.parametrization=mup", "--config.model.attention_scale=linear"]
    with pytest.raises(config_lib.ConfigError, match="parametrization='mup' supports train.optimizer adamw or lion"):
        config_lib.from_command_line(None, flags + ["--config.train.optimizer=muon"])
    with pytest.raises(config_lib.ConfigError, match="scales the scores by 1/d_k: set model.attention_scale=linear"):
        config_lib.from_command_line(None, flags[:1])
    assert dataclasses.replace(mup_config(64), parametrization="standard").width_multiplier == 1.0
