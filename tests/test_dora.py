"""DoRA (train.lora_variant=dora, txjax.state.lora): W' = m V / ||V||, V = W + s A B, the norm per output over the
weight's input axes. The merged weights against that formula in NumPy, on every adapted weight's layout (W^Q
[D, H, K], W^O [H, K, D], the FFN's [D, F] under a scanned layer axis); the norm held out of the gradient; peft's
DoRA model on txjax's export gives txjax's logits and the folder reads back; a few steps train the adapters and
magnitudes alone."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txjax.errors import ConfigError
from txjax.families import init_params, param_roles
from txjax.model import adapters
from txjax.model.config import ModelConfig
from txjax.model.models import DecoderLM
from txjax.sections.train import TrainConfig
from txjax.state import lora
from txjax.state.optim import OptimConfig
from txjax.state.train_state import optimizer, start_state
from txjax.training.step import train_step_function

VOCAB, L = 48, 8
CFG = ModelConfig(vocab_size=VOCAB, d_model=16, num_heads=2, num_kv_heads=1, d_ff=32, num_layers=2, max_len=L)
DORA = lora.LoraConfig(lora_rank=2, lora_alpha=3.0, lora_variant="dora")  # s = 1.5


def perturbed(adapted: lora.Adapted, seed=0) -> lora.Adapted:
    """`adapted` with A, B and m moved by noise: B != 0 and m != ||W||, so that each term shows."""
    rng = np.random.default_rng(seed)
    return adapted.replace(lora=jax.tree.map(lambda x: x + rng.normal(0, 0.3, x.shape).astype(x.dtype), adapted.lora))


def model_and_adapted():
    model = DecoderLM(CFG)
    params = init_params(model, jax.random.key(0))
    return model, params, lora.adapted(params, param_roles(model), DORA, jax.random.key(1))


def _flat(tree) -> dict:
    return {tuple(k.key for k in path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def test_at_init_dora_is_the_base_and_merged_is_the_numpy_formula():
    model, params, adapted = model_and_adapted()
    close = lambda got, want: np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    jax.tree.map(close, lora.model_params(adapted), params)  # m = ||W||, B = 0: W' = W to rounding
    adapted = perturbed(adapted)
    merged, base, roles = _flat(lora.model_params(adapted)), _flat(params), _flat(param_roles(model))
    ads = _flat(adapted.lora)
    paths = {p[:-1] for p in ads}
    assert {p[-2] if p[-1] == "kernel" else p[-1] for p in paths} == {"query", "key", "value", "out", "wi", "wo"}
    for path in paths:
        w, role = np.asarray(base[path], np.float64), roles[path]
        lead = w.shape[: w.ndim - role.inputs - role.outputs]
        inputs = int(np.prod(w.shape[len(lead) : w.ndim - role.outputs]))
        a, b, m = (np.asarray(ads[(*path, x)], np.float64) for x in "abm")
        v = w.reshape(*lead, inputs, -1) + 1.5 * a @ b  # rows: the input axes flattened, columns the outputs
        want = (m[..., None, :] * v / np.sqrt((v**2).sum(axis=-2, keepdims=True))).reshape(w.shape)
        assert m.shape == (*lead, v.shape[-1])
        np.testing.assert_allclose(merged[path], want, rtol=1e-5, atol=1e-6, err_msg="/".join(path))


def test_the_norm_is_held_out_of_the_gradient():
    """d/dB of <W', G> with ||V|| a constant: s A^T ((m / ||V||) G), in NumPy; m's: <V / ||V||, G> per output."""
    rng = np.random.default_rng(3)
    w, a, b, g = (rng.normal(size=s) for s in [(6, 2, 3), (6, 2), (2, 6), (6, 2, 3)])
    m = rng.normal(size=6) + 3
    f = lambda b, m: jnp.sum(adapters.merge(jnp.asarray(w), jnp.asarray(a), b, m) * g)
    grad_b, grad_m = jax.grad(f, argnums=(0, 1))(jnp.asarray(b), jnp.asarray(m))
    v = w.reshape(6, 6) + a @ b
    n = np.sqrt((v**2).sum(axis=0))
    np.testing.assert_allclose(grad_b, a.T @ (m / n * g.reshape(6, 6)), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(grad_m, (v / n * g.reshape(6, 6)).sum(axis=0), rtol=1e-4, atol=1e-5)


def test_a_few_steps_train_the_adapters_and_magnitudes_alone():
    """The house's train step under Muon (A and B matrices, orthogonalized; m a gain, as a norm's: Adam, not decayed)
    from step 0 (m = ||W||): the loss falls over 4 steps on one batch, A, B and m all move, the base is the same."""
    model = DecoderLM(CFG)
    t = TrainConfig(optim=OptimConfig(optimizer="muon", learning_rate=1e-2, warmup_steps=0, steps=4), lora=DORA)
    tx = optimizer(model, t.optim, DORA)
    base = init_params(model, jax.random.key(0))
    state = jax.jit(lambda: start_state(base, tx, model, 0, DORA))()
    tokens = np.random.default_rng(0).integers(0, VOCAB, (2, L + 1), dtype=np.int32)
    ones = np.ones((2, L), np.int32)
    batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "weights": ones.astype(np.float32)}
    batch |= {"positions": np.broadcast_to(np.arange(L, dtype=np.int32), (2, L)), "segment_ids": ones}
    step, losses, start = jax.jit(train_step_function(model, tx, t)), [], state.params.lora
    for _ in range(4):
        state, metrics = step(state, batch, jax.random.key(2))
        losses.append(float(metrics["loss"]))
    assert losses[-1] < losses[0] - 0.05, losses
    jax.tree.map(np.testing.assert_array_equal, state.params.base, base)
    moved = {p[-1] for p, x in _flat(state.params.lora).items() if not np.array_equal(x, _flat(start)[p])}
    assert moved == {"a", "b", "m"} and len(_flat(start)) == 3 * 6 * 1  # 6 weights of a scanned stack
    roles = _flat(lora.trained_roles(param_roles(model), DORA))
    assert {(p[-1], r.kind) for p, r in roles.items()} == {("a", "matrix"), ("b", "matrix"), ("m", "norm")}


def test_dora_with_dropout_is_one_line():
    model = DecoderLM(CFG)
    with pytest.raises(ConfigError) as refused:
        lora.targeted(param_roles(model), lora.LoraConfig(lora_rank=2, lora_dropout=0.1, lora_variant="dora"))
    assert "set train.lora_dropout=0 or train.lora_variant=lora" in str(refused.value)
    assert "\n" not in str(refused.value)


def test_peft_loads_the_dora_export_with_txjaxs_logits_and_it_reads_back(tmp_path):
    """A tiny random Llama: DoRA on every projection (B and m moved off their init), written as peft's folder
    (use_dora, lora_magnitude_vector) and loaded by peft.PeftModel.from_pretrained: txjax's merged model's logits
    within 1e-4 (float32); the folder read back onto the base is the same adapters and writes the same files."""
    pytest.importorskip("peft")
    pytest.importorskip("transformers")
    import json

    from tiny_hf import assert_logits_match, random_decoder, txjax_logits
    from tiny_peft import assert_adapter_reads_back, peft_loaded

    from txjax.convert.llama import load_llama, params_to_hf

    hf = random_decoder("llama", vocab_size=64, hidden_size=32, intermediate_size=48, max_position_embeddings=16)
    hf.save_pretrained(tmp_path / "hf")
    cfg, params = load_llama(tmp_path / "hf")
    folder = tmp_path / "adapter"
    adapted, merged = peft_loaded(hf, DecoderLM(cfg), params, params_to_hf, folder, variant="dora")
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["use_dora"] is True and config["r"] == 2
    tokens = np.random.default_rng(0).integers(0, 64, (2, 16))
    assert_logits_match(adapted, cfg, merged, tokens)
    assert np.abs(txjax_logits(cfg, merged, tokens) - txjax_logits(cfg, params, tokens)).max() > 1e-2
    assert_adapter_reads_back(folder, DecoderLM(cfg), params, params_to_hf, merged)
