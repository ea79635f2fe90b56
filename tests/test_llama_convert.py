"""Llama-family interop against transformers' PyTorch LlamaForCausalLM (Llama 3's rope scaling too),
MistralForCausalLM (with and without its sliding window), Qwen2ForCausalLM, Qwen3ForCausalLM (q/k norms, yarn) and
SmolLM3ForCausalLM (a NoPE layer: model.rope_layers):
logits, greedy generation (past Mistral's window) and the export round trip (skipped without the `interop` extra)."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tiny_hf import (  # noqa: E402
    COMMON,
    LLAMAS,
    LM_CTX,
    LM_VOCAB,
    assert_logits_match,
    hf_greedy,
    random_decoder,
    torch_logits,
    txjax_logits,
)
from tiny_peft import assert_adapter_reads_back, peft_loaded  # noqa: E402

from txjax.convert.llama import config_from_hf, load_llama, pairs, params_to_hf, save_llama  # noqa: E402
from txjax.decode import generate  # noqa: E402
from txjax.model.models import DecoderLM  # noqa: E402
from txjax.model.positional import apply_rope  # noqa: E402

MODELS = [kind for kind in LLAMAS if kind != "qwen3"]  # Qwen3's q/k norms: qwen3_yarn


@pytest.fixture(scope="module", params=MODELS)
def hf(request, tmp_path_factory):
    """(kind, transformers model, txjax's ModelConfig and params read from the folder it saved)"""
    model = random_decoder(request.param)
    folder = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(folder)
    return request.param, model, *load_llama(folder)


TOKENS = np.random.default_rng(0).integers(0, LM_VOCAB, (2, LM_CTX))


def test_pair_permutation_turns_rotate_half_into_adjacent_pairs():
    """HF's q * cos + rotate_half(q) * sin (NumPy here), permuted into pair order, is apply_rope's rotation."""
    k, base = 8, 100.0
    q_BxLxHxK = np.random.default_rng(1).normal(size=(1, 5, 2, k)).astype(np.float32)
    pos = np.arange(5)[None]
    angle = pos[..., None, None] * base ** (-np.arange(0, k, 2) / k)  # [1, L, 1, K/2]
    cos, sin = np.cos(np.concatenate([angle] * 2, -1)), np.sin(np.concatenate([angle] * 2, -1))
    rotate_half = np.concatenate([-q_BxLxHxK[..., k // 2 :], q_BxLxHxK[..., : k // 2]], -1)
    hf_rotated = q_BxLxHxK * cos + rotate_half * sin
    ours = apply_rope(jnp.asarray(q_BxLxHxK[..., pairs(k)]), jnp.asarray(pos), base)
    np.testing.assert_allclose(np.asarray(ours), hf_rotated[..., pairs(k)], atol=1e-5)


def test_logits_match_transformers(hf):
    kind, model, cfg, params = hf
    assert cfg.qkv_bias == (kind == "qwen2") and cfg.tie_embeddings == model.config.tie_word_embeddings
    assert (cfg.attention_window, cfg.qk_norm) == (8 if kind == "mistral_window" else 0, kind == "qwen3_yarn")
    assert cfg.rope_scaling == {"llama3": "llama3", "qwen3_yarn": "yarn"}.get(kind, "none")
    assert cfg.rope_layers == ("RN" if kind == "smollm3" else "")
    assert_logits_match(model, cfg, params, TOKENS)


def test_greedy_generation_matches_transformers(hf):
    _, model, cfg, params = hf
    prompt = TOKENS[0, :5].tolist()
    assert generate(DecoderLM(cfg), params, [prompt], max_new_tokens=32).ids[0] == hf_greedy(model, prompt, 32)


def test_export_round_trip(hf, tmp_path):
    _, model, cfg, params = hf
    out = save_llama(tmp_path / "out", cfg, params)
    assert config_from_hf(json.loads((out / "config.json").read_text()), has_head=True) == cfg
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    np.testing.assert_allclose(torch_logits(reloaded, TOKENS), torch_logits(model, TOKENS), atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "change, field",
    [
        ({"model_type": "gemma"}, "model_type"),
        ({"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 4.0}}, "rope_type"),
        ({"rope_scaling": {"type": "yarn", "factor": 2.0, "mscale": 0.7}}, "rope_scaling.mscale"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"model_type": "qwen2", "use_sliding_window": True}, "use_sliding_window"),
    ],
)
def test_unrepresentable_config_names_the_field(change, field):
    hf_config = {**COMMON, "model_type": "llama", **change}
    with pytest.raises(ValueError, match=field) as e:
        config_from_hf(hf_config, has_head=True)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("hf", ["qwen2", "qwen3_yarn"], indirect=True)  # Q/K/V biases; Q/K norms, RoPE permuted
def test_a_lora_adapter_loads_in_peft_with_txjaxs_logits(hf, tmp_path):
    """txjax's peft export of adapters on every projection (txjax.convert.peft_adapter, through params_to_hf's
    RoPE permutation of Q and K) loaded by peft onto the transformers model: txjax's merged model's logits; the
    folder read back onto the base is the same adapters."""
    pytest.importorskip("peft")
    _, model, cfg, params = hf
    adapted, merged = peft_loaded(model, DecoderLM(cfg), params, params_to_hf, tmp_path / "adapter")
    assert_logits_match(adapted, cfg, merged, TOKENS)
    assert np.abs(txjax_logits(cfg, merged, TOKENS) - txjax_logits(cfg, params, TOKENS)).max() > 1e-2
    assert_adapter_reads_back(tmp_path / "adapter", DecoderLM(cfg), params, params_to_hf, merged)
