"""Gated DeltaNet layers (model.layer_types, txjax.model.gated_deltanet): the chunked form against the delta rule
stepped one token at a time in this file (outputs and gradients, a length past the chunks, packed runs, a state
passed in), a mixed stack that trains, cached generation against the full forward pass, packed documents kept apart,
scanned groups as looped layers, and bad settings in one line."""

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from test_decode import EOS, PAD, greedy_by_recomputing, random_ids, random_params, teacher_forced_steps, tiny

from txjax import decode
from txjax.errors import ConfigError
from txjax.model.config import ModelConfig
from txjax.model.gated_deltanet import chunked_delta_rule
from txjax.model.models import DecoderLM, unstack_layers


def stepped_delta_rule(q, k, v, g, beta, runs, state):
    """The definition, one token at a time: S <- 0 where a token starts a run other than the previous token's (run
    0 continues `state`), S <- exp(g) S (I - beta k k^T) + beta v k^T (as [K, V]: S - beta k (k^T S) ...), o = q^T S."""
    outputs, previous = [], jnp.zeros_like(runs[:, 0])
    for t in range(q.shape[1]):
        kept = (runs[:, t] == previous)[:, None, None, None]
        s = jnp.where(kept, state, 0.0) * jnp.exp(g[:, t])[..., None, None]
        k_t, v_t, b_t = k[:, t], v[:, t], beta[:, t][..., None]
        delta = b_t * (v_t - jnp.einsum("bhk,bhkv->bhv", k_t, s))
        state = s + jnp.einsum("bhk,bhv->bhkv", k_t, delta)
        outputs.append(jnp.einsum("bhk,bhkv->bhv", q[:, t], state))
        previous = runs[:, t]
    return jnp.stack(outputs, 1), state


def delta_inputs(seed, b=2, l=11, h=2, dk=4, dv=3):
    rng = np.random.default_rng(seed)
    normal = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)
    unit = lambda t: t / jnp.linalg.norm(t, axis=-1, keepdims=True)
    g = -jnp.asarray(rng.uniform(0.0, 1.0, (b, l, h)), jnp.float32)
    beta = jnp.asarray(rng.uniform(0.0, 1.0, (b, l, h)), jnp.float32)
    runs = jnp.asarray([[0] * l, [0] * 3 + [1] * 5 + [2] * (l - 8)], jnp.int32)  # row 1: three runs, 0 continues
    return unit(normal(b, l, h, dk)) / dk**0.5, unit(normal(b, l, h, dk)), normal(b, l, h, dv), g, beta, runs


def test_the_chunked_form_is_the_delta_rule_stepped_one_token_at_a_time():
    """Chunks of 4 over 11 tokens (the last chunk padded), a state passed in, runs that restart it: outputs, final
    state and the gradients of both with respect to every input and the state, in float32; and one chunk of 11."""
    q, k, v, g, beta, runs = delta_inputs(0)
    state = jnp.asarray(np.random.default_rng(1).normal(size=(2, 2, 4, 3)), jnp.float32)
    weights_o, weights_s = (
        jnp.asarray(np.random.default_rng(2).normal(size=s), jnp.float32) for s in ((2, 11, 2, 3), (2, 2, 4, 3))
    )

    def loss(fn, *args):
        o, s = fn(*args)
        return jnp.sum(o * weights_o) + jnp.sum(s * weights_s), (o, s)

    chunked = lambda q, k, v, g, beta, s: chunked_delta_rule(q, k, v, g, beta, runs, s, 4)
    stepped = lambda q, k, v, g, beta, s: stepped_delta_rule(q, k, v, g, beta, runs, s)
    grads = lambda fn: jax.jit(jax.value_and_grad(lambda *a: loss(fn, *a), tuple(range(6)), has_aux=True))
    (_, got), got_grads = grads(chunked)(q, k, v, g, beta, state)
    (_, want), want_grads = grads(stepped)(q, k, v, g, beta, state)
    for a, b in zip((*got, *got_grads), (*want, *want_grads)):
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=2e-5)
    # jitted: op by op, each primitive of the chunks' loop and of the 11 steps compiled alone
    one_chunk = jax.jit(chunked_delta_rule, static_argnums=7)(q, k, v, g, beta, runs, state, 16)  # padded to 16
    for a, b in zip(one_chunk, want):
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=2e-5)
    one_run = jax.jit(stepped_delta_rule)(q, k, v, g, beta, runs * 0, state)[0]
    assert float(jnp.abs(got[0][1, 3] - one_run[1, 3]).max()) > 1e-2


def test_a_long_chunk_of_strong_decays_rounds_as_float32_does():
    """One chunk of 64 tokens whose decays sum to about -64 (Qwen3-Next's tiny model reaches -55): float32 within 2e-7
    of the rule stepped in float64 (outputs to 0.8). Decays taken as differences of the chunk's cumulative sums
    cancelled to 7e-7 here (1.3e-6 at twice the decay), and Qwen3-Next's logits to 2e-4 from transformers'."""
    q, k, v, g, beta, runs = delta_inputs(0, l=64, dk=8, dv=6)
    state = np.zeros((2, 2, 8, 6))
    with jax.enable_x64(True):
        exact = stepped_delta_rule(*(np.asarray(t, np.float64) for t in (q, k, v, 2 * g, beta)), runs, state)[0]
    got = jax.jit(chunked_delta_rule, static_argnums=7)(q, k, v, 2 * g, beta, runs, jnp.float32(state), 64)[0]
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(exact), atol=2e-7, rtol=0)


def linear_lm(**overrides):
    """2 layers, 'LF': a Gated DeltaNet layer (2 query/key heads on 4 value heads, d_k 8, d_v 4) then a full one."""
    fields = dict(layer_types="LF", linear_heads=2, linear_v_heads=4, linear_head_dim=8, linear_v_head_dim=4)
    cfg = tiny(**{"max_len": 32, "linear_chunk": 4, **fields, **overrides})
    model = DecoderLM(cfg)
    return model, random_params(model, jnp.zeros((1, 4), jnp.int32))


def test_packed_documents_do_not_see_each_other_and_scanned_groups_are_looped_layers():
    """A row of two documents: changing the first one's tokens leaves the second's logits as they are (the
    convolution and the state restart at its first token), and equal to the second document alone; scanned (one
    group 'LF' scanned) as looped and as rematerialized."""
    model, params = linear_lm()
    tokens = jnp.asarray(random_ids(0, (1, 14)))
    seg = jnp.asarray([[1] * 6 + [2] * 8])
    pos = jnp.asarray([list(range(6)) + list(range(8))])
    apply = jax.jit(lambda t: model.apply({"params": params}, t, pos, seg))
    other = tokens.at[:, :6].set(jnp.asarray(random_ids(1, (1, 6))))
    both, changed = apply(tokens), apply(other)
    np.testing.assert_allclose(changed[:, 6:], both[:, 6:], atol=1e-6)
    assert float(jnp.abs(changed[:, :6] - both[:, :6]).max()) > 1e-2
    alone = jax.jit(model.apply)({"params": params}, tokens[:, 6:])
    np.testing.assert_allclose(both[:, 6:], alone, atol=2e-5)
    remat = DecoderLM(dataclasses.replace(model.cfg, remat="full"))  # the layer kinds stay static under remat
    np.testing.assert_allclose(jax.jit(remat.apply)({"params": params}, tokens, pos, seg), both, atol=2e-5)
    looped = DecoderLM(dataclasses.replace(model.cfg, scan_layers=False))
    np.testing.assert_allclose(
        jax.jit(looped.apply)({"params": unstack_layers(params)}, tokens, pos, seg), both, atol=2e-5
    )


def test_cached_generation_follows_the_full_forward_pass():
    """Teacher-forced steps from a prefill of 9 tokens (two chunks and a part: the chunked form, then the
    recurrence) give the full forward pass's logits; greedy generation from prompts of 3 and 6 tokens, left-padded
    together and prefilled in chunks of 4, gives the tokens that recomputing the full forward pass gives."""
    model, params = linear_lm()
    tokens = jnp.asarray(random_ids(1, (2, 16)))
    forward = jax.jit(lambda x: model.apply({"params": params}, x))  # op by op, each primitive compiled alone
    want = forward(tokens)
    dmodel, dparams = decode.for_decoding(model, params, 2)

    @jax.jit
    def cached(tokens):
        cache = decode.init_cache(dmodel, 2, 16)
        first, cache = decode.extend(dmodel, dparams, cache, tokens[:, :9], jnp.arange(9)[None].repeat(2, 0))
        return jnp.concatenate(
            [first[:, None], teacher_forced_steps(dmodel, dparams, cache, tokens, 9).swapaxes(0, 1)], 1
        )

    np.testing.assert_allclose(cached(tokens), want[:, 8:], atol=1e-4, rtol=1e-5)
    prompts = [random_ids(2, 3).tolist(), random_ids(3, 6).tolist()]
    expected = [greedy_by_recomputing(forward, p, 12, 32) for p in prompts]
    got = decode.generate(dmodel, dparams, prompts, max_new_tokens=12, eos_id=EOS, pad_id=PAD, prefill_chunk=4)
    assert got.ids == expected


def test_a_mixed_stack_trains():
    """'LF' on a task a token mixer must solve (each target is the token before the input): the loss falls."""
    model, params = linear_lm()
    inputs = jnp.asarray(random_ids(4, (16, 16)))
    targets = jnp.roll(inputs, 1, axis=1)  # target t: input t - 1

    def loss_fn(p):
        logits = model.apply({"params": p}, inputs)
        return optax.softmax_cross_entropy_with_integer_labels(logits[:, 1:], targets[:, 1:]).mean()

    @jax.jit
    def step(p, s):
        loss, grads = jax.value_and_grad(loss_fn)(p)
        updates, s = opt.update(grads, s, p)
        return optax.apply_updates(p, updates), s, loss

    opt = optax.adam(1e-2)
    params = jax.tree_util.tree_map(lambda x: x * 0.2, params)
    state, losses = opt.init(params), []
    for _ in range(30):
        params, state, loss = step(params, state)
        losses.append(float(loss))
    assert losses[-1] < 0.5 * losses[0], losses


@pytest.mark.parametrize(
    "fields,named",
    [
        (dict(layer_types="LX"), "layer_types='LX'"),
        (dict(layer_types="LLF", num_layers=4), "divide model.num_layers=4"),
        (dict(linear_heads=2), "no layer is linear"),
        (dict(layer_types="L", linear_heads=2, linear_v_heads=3), "linear_v_heads=3"),
        (dict(layer_types="LF", attention_window=4), "attention_window=0"),
    ],
)
def test_bad_linear_settings_are_one_line(fields, named):
    with pytest.raises(ValueError, match=named) as e:
        ModelConfig(vocab_size=8, **fields)
    assert "\n" not in str(e.value)


def test_lm_eval_refuses_linear_layers_in_one_line():
    """lm-eval's requests share a prefix under a tree mask (branches of one segment), which a recurrence cannot read."""
    lm_eval_model = pytest.importorskip("txjax.evaluate.lm_eval_model")
    model = DecoderLM(tiny(layer_types="LF"))
    with pytest.raises(ConfigError, match="linear \\(Gated DeltaNet\\) layers cannot read") as e:
        lm_eval_model.TxjaxLM(run=types.SimpleNamespace(model=model))
    assert "\n" not in str(e.value)
