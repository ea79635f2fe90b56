"""Tests of txjax.model.moe: the layer against a loop over tokens and their experts written here (outputs and
gradients), the routers and their ties, dropless and capacity routing counted, the aux losses against their formulas,
bias balancing, a tiny MoE LM trained through the normal train path, and cached decoding against the full pass."""

import dataclasses
import functools
import json
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txjax import config as config_lib
from txjax import decode
from txjax.decode import init_cache
from txjax.experiment import load_workdir
from txjax.model import moe
from txjax.model.config import ModelConfig
from txjax.model.models import DecoderLM, unstack_layers
from txjax.ops.summary import summarize
from txjax.training.loop import train

D, X, F = 8, 4, 6  # d_model, experts, expert width


def layer_cfg(**overrides):
    fields = dict(vocab_size=11, d_model=D, num_heads=2, d_ff=16, num_layers=1, max_len=16, num_experts=X)
    return ModelConfig(**{**fields, "moe_d_ff": F, "activation": "swiglu", **overrides})


def random_params(module, *args, seed=0):
    shapes = nn.meta.unbox(jax.eval_shape(module.init, jax.random.key(0), *args)["params"])
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map(lambda s: jnp.asarray(rng.normal(0.0, 0.5, s.shape), s.dtype), shapes)


# ---------------------------------------------------------------- the reference: one token and one expert at a time


def top_k_lower_index_first(v, k):
    """Indices of the k largest entries of a vector, a tie going to the lower index."""
    return sorted(range(len(v)), key=lambda i: (-v[i], i))[:k]


def softmax(v, xp=np):
    e = xp.exp(v - v.max())
    return e / e.sum()


def reference_route(z, router, k, norm_topk=False, bias=None, xp=np, experts=None):
    """(gates, experts) of one token's router logits z [X] (the experts chosen here unless given: under jax.grad)."""
    if experts is None:
        sigmoid_plus_bias = 1.0 / (1.0 + np.exp(-z)) + (0.0 if bias is None else bias)  # DeepSeek-V3 chooses on s + b
        experts = top_k_lower_index_first(sigmoid_plus_bias if router == "sigmoid" else z, k)
    if router == "topk_then_softmax":
        return softmax(z[np.array(experts)], xp), experts
    scores = softmax(z, xp) if router == "softmax_then_topk" else 1.0 / (1.0 + xp.exp(-z))
    gates = scores[np.array(experts)]
    return (gates / gates.sum() if norm_topk else gates), experts


def reference_moe(params, x_MxD, cfg, keep=None, xp=np, choices=None):
    """y_t = sum_j g_tj FFN_{e_tj}(x_t) + shared(x_t), looping over tokens t and their chosen experts; keep(t, j):
    whether assignment (t, j) is kept (capacity); choices: each token's experts (else chosen here). SwiGLU experts.
    Returns (y [M, D], the experts chosen)."""
    silu = lambda a: a / (1.0 + xp.exp(-a))
    ex = params["experts"]
    rows, chosen = [], []
    for t in range(x_MxD.shape[0]):
        x = x_MxD[t]
        z = x @ params["router"]["kernel"]
        route = (cfg.router, cfg.experts_per_token, cfg.moe_norm_topk, params.get("router_bias"), xp)
        gates, experts = reference_route(z, *route, experts=None if choices is None else choices[t])
        chosen.append(experts)
        y = 0.0 * x
        for j, e in enumerate(experts):
            if keep is None or keep(t, j):
                y = y + gates[j] * ((silu(x @ ex["wi"][e]) * (x @ ex["wi_gate"][e])) @ ex["wo"][e])
        if "shared_experts" in params:
            sh = params["shared_experts"]
            shared = (silu(x @ sh["wi"]["kernel"]) * (x @ sh["wi_gate"]["kernel"])) @ sh["wo"]["kernel"]
            if "shared_expert_gate" in params:  # Qwen2-MoE: sigmoid(x w_s) scales the shared experts
                shared = shared / (1.0 + xp.exp(-(x @ params["shared_expert_gate"]["kernel"])))
            y = y + shared
        rows.append(y)
    return xp.stack(rows), chosen


@functools.partial(jax.jit, static_argnums=0)
def apply_moe(cfg, params, x_BxLxD):
    out, sown = moe.MoE(cfg).apply({"params": params}, x_BxLxD, mutable=[moe.MOE_STATS])
    return out, sown[moe.MOE_STATS]


@pytest.mark.parametrize(
    "overrides",
    [
        dict(router="topk_then_softmax"),
        dict(router="softmax_then_topk", moe_norm_topk=True, num_shared_experts=1),
        dict(router="softmax_then_topk", num_shared_experts=2, shared_expert_gate=True),
        dict(router="sigmoid", experts_per_token=3),
    ],
)
def test_layer_equals_a_loop_over_tokens_and_their_experts_outputs_and_gradients(overrides):
    cfg = layer_cfg(**overrides)
    x_BxLxD = jnp.asarray(np.random.default_rng(1).normal(size=(2, 5, D)), jnp.float32)
    params = random_params(moe.MoE(cfg), x_BxLxD)
    if cfg.router == "sigmoid":  # a bias that changes the choice of some tokens
        params["router_bias"] = jnp.asarray([0.3, -0.2, 0.0, 0.1], jnp.float32)
    out, stats = apply_moe(cfg, params, x_BxLxD)
    as64 = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
    expected, choices = reference_moe(as64, np.asarray(x_BxLxD, np.float64).reshape(-1, D), cfg)
    np.testing.assert_allclose(np.asarray(out).reshape(-1, D), expected, rtol=1e-4, atol=1e-5)
    assert float(stats["dropped"]) == 0.0 and float(stats["expert_tokens"].sum()) == 10 * cfg.experts_per_token

    cotangent = jnp.asarray(np.random.default_rng(2).normal(size=(10, D)), jnp.float32)
    layer_loss = lambda p, x: jnp.sum(apply_moe(cfg, p, x)[0].reshape(-1, D) * cotangent)
    loop_loss = lambda p, x: jnp.sum(reference_moe(p, x.reshape(-1, D), cfg, xp=jnp, choices=choices)[0] * cotangent)
    got, want = (jax.jit(jax.grad(f, (0, 1)))(params, x_BxLxD) for f in (layer_loss, loop_loss))
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- routers, ties, counts, capacity, aux losses


@pytest.mark.parametrize("router", ["topk_then_softmax", "softmax_then_topk", "sigmoid"])
def test_routers_against_numpy_and_ties_go_to_the_lower_expert(router):
    rng = np.random.default_rng(3)
    z_MxX = rng.normal(size=(6, 5)).astype(np.float32)
    z_MxX[0] = [1.0, 3.0, 3.0, 3.0, 0.0]  # a three-way tie for first place
    z_MxX[1] = 2.0  # all equal
    bias = rng.normal(size=5).astype(np.float32) if router == "sigmoid" else None
    bias_ = None if bias is None else jnp.asarray(bias)
    gates, experts, probs = moe.route(jnp.asarray(z_MxX), router, 2, router != "topk_then_softmax", bias_)
    for t in range(6):
        want_gates, want_experts = reference_route(
            z_MxX[t].astype(np.float64), router, 2, router != "topk_then_softmax", bias
        )
        assert list(np.asarray(experts[t])) == want_experts
        np.testing.assert_allclose(gates[t], want_gates, rtol=1e-6)
    tied = moe.route(jnp.asarray(z_MxX[:2]), router, 2, False, None if bias is None else jnp.zeros(5))[1]
    assert np.asarray(tied).tolist() == [[1, 2], [0, 1]]
    scores = np.exp(z_MxX) / np.exp(z_MxX).sum(-1, keepdims=True) if router != "sigmoid" else 1 / (1 + np.exp(-z_MxX))
    np.testing.assert_allclose(probs, scores / scores.sum(-1, keepdims=True), rtol=1e-6)


def test_group_limited_sigmoid_router_against_numpy():
    """DeepSeek-V3's router: 12 experts in 4 groups of 3, the 2 groups whose two best s + b sum most, the top 3 of
    their experts by s + b; gates s renormalised, times routed_scaling_factor 2.5; for some tokens the limit changes
    the choice."""
    rng = np.random.default_rng(4)
    z_MxX, bias = rng.normal(size=(16, 12)).astype(np.float32), rng.normal(0, 0.3, 12).astype(np.float32)
    gates, experts, _ = moe.route(jnp.asarray(z_MxX), "sigmoid", 3, True, jnp.asarray(bias), (4, 2), 2.5)
    changed = 0
    for t in range(16):
        s = 1.0 / (1.0 + np.exp(-z_MxX[t].astype(np.float64)))
        c = s + bias
        group_scores = [sum(sorted(c[3 * g : 3 * g + 3])[-2:]) for g in range(4)]
        allowed = [e for g in top_k_lower_index_first(group_scores, 2) for e in range(3 * g, 3 * g + 3)]
        want = top_k_lower_index_first(np.where(np.isin(np.arange(12), allowed), c, -np.inf), 3)
        assert list(np.asarray(experts[t])) == want
        np.testing.assert_allclose(gates[t], 2.5 * s[want] / s[want].sum(), rtol=1e-6)
        changed += want != top_k_lower_index_first(c, 3)
    assert changed > 0


def expected_keep(experts_MxJ, capacity):
    """GShard's order: first choices before second ones, each in token order; an expert keeps its first C."""
    used, keep = [0] * X, np.zeros(experts_MxJ.shape, bool)
    for j in range(experts_MxJ.shape[1]):
        for t in range(experts_MxJ.shape[0]):
            e = experts_MxJ[t, j]
            keep[t, j], used[e] = used[e] < capacity, used[e] + 1
    return keep


def test_capacity_drops_exactly_the_overflow_and_counts_it():
    cfg = layer_cfg(moe_capacity_factor=0.75)
    x_BxLxD = jnp.asarray(np.random.default_rng(4).normal(size=(2, 6, D)), jnp.float32)
    params = random_params(moe.MoE(cfg), x_BxLxD)
    params["router"]["kernel"] = params["router"]["kernel"].at[:, 0].add(1.0)  # crowd expert 0
    out, stats = apply_moe(cfg, params, x_BxLxD)

    x_MxD = np.asarray(x_BxLxD, np.float64).reshape(-1, D)
    z_MxX = x_MxD @ np.asarray(params["router"]["kernel"], np.float64)
    experts_MxJ = np.array([top_k_lower_index_first(z, 2) for z in z_MxX])
    capacity = math.ceil(0.75 * 12 * 2 / X)
    keep = expected_keep(experts_MxJ, capacity)
    assert 0 < (~keep).sum() and float(stats["dropped"]) == (~keep).sum()
    np.testing.assert_array_equal(stats["expert_tokens"], np.bincount(experts_MxJ.ravel(), minlength=X))
    as64 = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
    expected, _ = reference_moe(as64, x_MxD, cfg, keep=lambda t, j: keep[t, j])
    np.testing.assert_allclose(np.asarray(out).reshape(-1, D), expected, rtol=1e-4, atol=1e-5)


def test_dropless_routes_every_assignment_however_crowded():
    experts_MxJ = jnp.asarray(np.random.default_rng(5).integers(0, 2, size=(64, 2)))  # two of four experts
    order, sizes, keep, counts = moe.plan(experts_MxJ, X)
    assert bool(keep.all()) and int(sizes.sum()) == 128
    np.testing.assert_array_equal(counts, np.bincount(np.asarray(experts_MxJ).ravel(), minlength=X))
    np.testing.assert_array_equal(np.asarray(experts_MxJ).T.ravel()[np.asarray(order)], np.sort(experts_MxJ.T.ravel()))


@pytest.mark.parametrize("sizes", [(10, 0, 25, 15), (3, 4, 5, 6)])
def test_cpu_blocks_equal_ragged_dot_outputs_and_gradients(sizes):
    """XLA:CPU's blocked grouping (blocks of 4 and 64 rows) against jax.lax.ragged_dot, which multiplies every row by
    every expert's weight on a CPU but is the definition; rows past the groups' sum (32 of 50 in one case) give 0."""
    rng = np.random.default_rng(9)
    rows, w = jnp.asarray(rng.normal(size=(50, 6)), jnp.float32), jnp.asarray(rng.normal(size=(4, 6, 5)), jnp.float32)
    sizes = jnp.asarray(sizes, jnp.int32)
    cotangent = jnp.asarray(rng.normal(size=(50, 5)), jnp.float32)
    # every product and gradient jitted: op by op, each primitive of the grouping and of its gradient compiled alone
    ragged = jax.jit(jax.lax.ragged_dot)(rows, w, sizes)
    want = jax.jit(jax.grad(lambda r, w: jnp.sum(jax.lax.ragged_dot(r, w, sizes) * cotangent), (0, 1)))(rows, w)

    def blocked_product(r, w, block):
        enter, product, leave = moe.blocked(sizes, 50, block)
        return leave(product(enter(r), w))

    for block in (4, 64):
        np.testing.assert_allclose(jax.jit(blocked_product, static_argnums=2)(rows, w, block), ragged, atol=1e-5)
        loss = lambda r, w, block=block: jnp.sum(blocked_product(r, w, block) * cotangent)
        for g, ref in zip(jax.jit(jax.grad(loss, (0, 1)))(rows, w), want):
            np.testing.assert_allclose(g, ref, atol=1e-4)


def test_aux_losses_equal_their_formulas():
    cfg = layer_cfg(router="softmax_then_topk", experts_per_token=2)
    x_BxLxD = jnp.asarray(np.random.default_rng(6).normal(size=(1, 7, D)), jnp.float32)
    params = random_params(moe.MoE(cfg), x_BxLxD)
    _, stats = apply_moe(cfg, params, x_BxLxD)
    z_MxX = np.asarray(x_BxLxD, np.float64)[0] @ np.asarray(params["router"]["kernel"], np.float64)
    p_MxX = np.exp(z_MxX) / np.exp(z_MxX).sum(-1, keepdims=True)
    counts = np.bincount(np.array([top_k_lower_index_first(p, 2) for p in p_MxX]).ravel(), minlength=X)
    balance = X * np.sum(counts / (7 * 2) * p_MxX.mean(0))  # Switch eq. 4 with k = 2 choices per token
    z_loss = np.mean(np.log(np.exp(z_MxX).sum(-1)) ** 2)  # ST-MoE eq. 5
    np.testing.assert_allclose(stats["balance_loss"], balance, rtol=1e-5)
    np.testing.assert_allclose(stats["z_loss"], z_loss, rtol=1e-5)
    np.testing.assert_allclose(moe.aux_loss(stats, 0.1, 0.01), 0.1 * balance + 0.01 * z_loss, rtol=1e-5)


def test_bias_balancing_raises_the_underloaded_and_lowers_the_overloaded():
    params = {"ffn": {"router_bias": jnp.zeros((2, 4)), "router": {"kernel": jnp.ones((2, 3, 4))}}}
    stats = {"ffn": {"expert_tokens": jnp.asarray([[5.0, 1.0, 2.0, 0.0], [2.0, 2.0, 2.0, 2.0]])}}
    out = moe.balance_biases(params, stats, 0.01)
    np.testing.assert_allclose(out["ffn"]["router_bias"], [[-0.01, 0.01, 0.0, 0.01], [0.0, 0.0, 0.0, 0.0]])
    np.testing.assert_array_equal(out["ffn"]["router"]["kernel"], params["ffn"]["router"]["kernel"])


def test_bad_moe_settings_are_one_line_errors():
    with pytest.raises(ValueError, match="model.experts_per_token is read only by an MoE model"):
        ModelConfig(vocab_size=11, experts_per_token=1)
    with pytest.raises(ValueError, match="must be <= model.num_experts"):
        ModelConfig(vocab_size=11, num_experts=2, experts_per_token=3)
    with pytest.raises(ValueError, match="multiple of model.moe_every=3"):
        ModelConfig(vocab_size=11, num_experts=2, moe_every=3)
    with pytest.raises(
        ValueError, match="num_layers=4 - model.moe_dense_first=1 must be a multiple of model.moe_every=2"
    ):
        ModelConfig(vocab_size=11, num_experts=2, moe_every=2, moe_dense_first=1)
    with pytest.raises(ValueError, match="moe_dense_first=4 leaves model.num_layers=4 no MoE layer"):
        ModelConfig(vocab_size=11, num_experts=2, moe_dense_first=4)
    with pytest.raises(ValueError, match="set model.num_shared_experts > 0"):
        ModelConfig(vocab_size=11, num_experts=2, shared_expert_gate=True)
    with pytest.raises(config_lib.ConfigError, match="moe_bias_rate=0.001 is not read by model.router"):
        config_lib.from_command_line(None, ["--config.model.num_experts=4", "--config.train.moe_bias_rate=1e-3"])
    with pytest.raises(config_lib.ConfigError, match="moe_aux_weight=0.1 is not read by model.num_experts=0"):
        config_lib.from_command_line(None, ["--config.train.moe_aux_weight=0.1"])


# ---------------------------------------------------------------- in the model: layout, FLOPs, training, decoding


def lm_cfg(**overrides):
    fields = dict(vocab_size=13, d_model=32, num_heads=4, d_ff=64, num_layers=2, max_len=24, positional="rope")
    return ModelConfig(**{**fields, "num_experts": 4, "moe_d_ff": 32, **overrides})


def test_active_parameters_count_k_of_x_experts():
    moe_cfg, dense_cfg = lm_cfg(experts_per_token=2, moe_every=2), lm_cfg(num_experts=0, moe_d_ff=None)
    moe_sum, dense_sum = summarize(moe_cfg), summarize(dense_cfg)
    ffn_weights = 2 * 32 * 64  # the dense layer-1 FFN the MoE layer replaces: 2 x 32 x 32 per expert, 2 of 4 used
    assert moe_sum.flop_params == dense_sum.flop_params - ffn_weights + 2 * (2 * 32 * 32) + 32 * 4
    assert moe_sum.total_params == dense_sum.total_params - ffn_weights + 4 * (2 * 32 * 32) + 32 * 4


@pytest.mark.parametrize("dense_first", [0, 1])
def test_alternating_layers_scanned_equal_looped(dense_first):
    """Dense and MoE layers alternating, after a dense layer of their own with model.moe_dense_first=1."""
    cfg = lm_cfg(moe_every=2, num_layers=4 + dense_first, moe_dense_first=dense_first)
    model, tokens = DecoderLM(cfg), jnp.asarray(np.random.default_rng(7).integers(0, 13, (2, 9)), jnp.int32)
    params = random_params(model, tokens)
    assert set(params["decoder"]["layers"]) == {"block_0", "block_1"} and "experts" in str(
        params["decoder"]["layers"]["block_1"]
    )
    assert "experts" not in str(params["decoder"]["layers"]["block_0"])
    assert "experts" not in str(params["decoder"].get("dense_layers", {})) and (
        "dense_layers" in params["decoder"]
    ) == bool(dense_first)
    looped = DecoderLM(dataclasses.replace(cfg, scan_layers=False))
    both = jax.jit(lambda p: (model.apply({"params": p}, tokens), looped.apply({"params": unstack_layers(p)}, tokens)))
    np.testing.assert_allclose(*both(params), atol=1e-5)


def test_a_tiny_moe_lm_trains_through_the_train_path(tmp_path):
    flags = ["--config.data.max_digits=4", "--config.data.eval_size=16", "--config.model.num_layers=2"]
    flags += ["--config.model.d_model=32", "--config.model.num_heads=2", "--config.model.d_ff=64"]
    flags += ["--config.model.num_experts=4", "--config.model.moe_d_ff=32", "--config.model.router=sigmoid"]
    flags += ["--config.train.moe_z_weight=0.001", "--config.train.moe_bias_rate=0.01"]
    flags += ["--config.train.steps=30", "--config.train.batch_size=16", "--config.train.warmup_steps=5"]
    flags += ["--config.train.log_every=10", "--config.train.eval_every=0", "--config.train.learning_rate=3e-3"]
    result = train(config_lib.from_command_line(None, flags), tmp_path)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    records = [r for r in map(json.loads, lines) if r["split"] == "train"]
    assert records[-1]["loss"] < 0.9 * records[0]["loss"]
    assert result["valid_moe_dropped_fraction"] == 0.0
    assert 0.0 < result["valid_moe_load_min"] <= 0.25 <= result["valid_moe_load_max"] < 1.0
    assert result["valid_moe_balance_loss"] > 0.0 and result["valid_moe_z_loss"] > 0.0
    bias = np.asarray(load_workdir(tmp_path).params["decoder"]["layers"]["ffn"]["router_bias"])  # balanced, no loss
    assert bias.shape == (2, 4) and 0 < np.abs(bias).max() <= 30 * 0.01 + 1e-6


@functools.cache
def moe_lm():
    model = DecoderLM(lm_cfg(num_shared_experts=1, activation="swiglu"))
    return model, random_params(model, jnp.zeros((1, 4), jnp.int32))


def test_cached_decoding_routes_each_step_as_the_full_pass_does():
    """Prefill then one-token steps (each routing its rows alone) give the full forward pass's logits, on the
    decoding layout (txjax.decode.kernels)."""
    model, params = moe_lm()
    tokens_BxL, p = np.random.default_rng(8).integers(3, 13, (2, 12)).astype(np.int32), 5
    dmodel, dparams = decode.for_decoding(model, params, 2)

    @jax.jit
    def run(params, dparams, tokens_BxL):  # one compilation: the full forward, the prefill and the steps
        full_BxLxV = model.apply({"params": params}, tokens_BxL)
        cache = init_cache(dmodel, 2, 12)
        prefill_BxV, cache = decode.extend(dmodel, dparams, cache, tokens_BxL[:, :p], jnp.arange(p)[None].repeat(2, 0))

        def step(cache, t):
            token_Bx1 = jax.lax.dynamic_slice_in_dim(tokens_BxL, t, 1, axis=1)
            logits_BxV, cache = decode.extend(dmodel, dparams, cache, token_Bx1, jnp.full(token_Bx1.shape, t))
            return cache, logits_BxV

        steps_LxBxV = jax.lax.scan(step, cache, jnp.arange(p, 12))[1]
        return full_BxLxV, jnp.concatenate([prefill_BxV[None], steps_LxBxV]).transpose(1, 0, 2)

    full_BxLxV, cached_BxLxV = run(params, dparams, tokens_BxL)
    np.testing.assert_allclose(cached_BxLxV, full_BxLxV[:, p - 1 :], atol=2e-5, rtol=1e-5)


def test_batched_greedy_generation_equals_the_full_pass_argmax():
    model, params = moe_lm()
    prompts = ((5, 7), (3, 4, 8, 9, 6, 10), (11,))
    out = decode.generate(model, params, prompts, max_new_tokens=6, eos_id=1)
    forward = jax.jit(lambda x: model.apply({"params": params}, x))
    for prompt, ids in zip(prompts, out.ids):
        seq = list(prompt)
        for _ in range(6):
            row = np.zeros((1, 16), np.int32)
            row[0, : len(seq)] = seq
            token = int(jnp.argmax(forward(row)[0, len(seq) - 1]))
            if token == 1:
                break
            seq.append(token)
        assert ids == seq[len(prompt) :]
