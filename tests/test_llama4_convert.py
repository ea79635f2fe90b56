"""Llama 4 text (transformers' Llama4ForCausalLM) in and out: a tiny random model with chunked RoPE layers and NoPE
layers whose temperature binds, q/k L2 norm and alternating dense / top-1 MoE layers with a shared expert: logits
within 1e-4 of transformers', 40 greedy tokens equal past several chunk boundaries, the export reloaded by
transformers with the same logits, `run.py import` / `export` of its folder, and what Llama 4 cannot hold refused in
one line."""

import dataclasses
import json

import numpy as np
import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tiny_hf import LLAMA4, assert_logits_match, decoder_config, hf_greedy, save_decoder, torch_logits  # noqa: E402

import run  # noqa: E402
from txjax.convert.llama4 import config_from_hf, load_llama4, save_llama4  # noqa: E402
from txjax.decode import generate  # noqa: E402
from txjax.errors import ConfigError  # noqa: E402
from txjax.experiment import load_workdir  # noqa: E402
from txjax.model.models import DecoderLM  # noqa: E402

TOKENS = np.random.default_rng(0).integers(0, LLAMA4["vocab_size"], (2, LLAMA4["max_position_embeddings"]))


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    """(transformers model, its folder, txjax's ModelConfig and params read from it)."""
    folder = tmp_path_factory.mktemp("llama4")
    model = save_decoder("llama4_text", folder)
    return model, folder, *load_llama4(folder)


def test_logits_match_transformers(hf):
    model, _, cfg, params = hf
    assert (cfg.rope_layers, cfg.attention_chunk, cfg.attention_temperature, cfg.qk_l2_norm) == ("RNRN", 8, 0.5, True)
    assert (cfg.num_experts, cfg.experts_per_token, cfg.num_shared_experts, cfg.moe_every) == (4, 1, 1, 2)
    assert (cfg.router, cfg.moe_gate_input, cfg.d_ff, cfg.expert_d_ff) == ("sigmoid", True, 48, 16)
    assert_logits_match(model, cfg, params, TOKENS)


def test_greedy_generation_past_the_chunks_matches_transformers(hf):
    model, _, cfg, params = hf
    prompt = TOKENS[0, :5].tolist()
    assert generate(DecoderLM(cfg), params, [prompt], max_new_tokens=40).ids[0] == hf_greedy(model, prompt, 40)


def test_export_round_trip(hf, tmp_path):
    model, _, cfg, params = hf
    out = save_llama4(tmp_path / "out", cfg, params)
    hf_config = json.loads((out / "config.json").read_text())
    assert hf_config["architectures"] == ["Llama4ForCausalLM"] and config_from_hf(hf_config, has_head=True) == cfg
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    np.testing.assert_allclose(torch_logits(reloaded, TOKENS), torch_logits(model, TOKENS), atol=1e-5, rtol=0)


def test_run_py_import_and_export(hf, tmp_path, capsys):
    """The folder imported into a workdir keeps its parameters; `run.py export` picks the Llama 4 writer."""
    _, folder, cfg, params = hf
    assert run.main(["import", f"--from={folder}", f"--workdir={tmp_path / 'run'}"]) == 0
    loaded = load_workdir(tmp_path / "run")
    assert loaded.model.cfg == cfg
    assert run.main(["export", f"--workdir={tmp_path / 'run'}", f"--to={tmp_path / 'out'}"]) == 0
    assert json.loads((tmp_path / "out" / "config.json").read_text())["model_type"] == "llama4_text"


def test_what_llama4_cannot_hold_is_refused_in_one_line(hf, tmp_path):
    """A trained router bias (train.moe_bias_rate) and a field the format has not (q/k norms with gains): one line
    each, nothing written."""
    _, _, cfg, params = hf
    biased = {**params, "decoder": {**params["decoder"], "layers": dict(params["decoder"]["layers"])}}
    group = dict(biased["decoder"]["layers"]["block_1"])
    group["ffn"] = {**group["ffn"], "router_bias": np.ones_like(group["ffn"]["router_bias"])}
    biased["decoder"]["layers"]["block_1"] = group
    with pytest.raises(ConfigError, match=r"^export to Llama4ForCausalLM cannot express layer 1's router bias") as e:
        save_llama4(tmp_path / "biased", cfg, biased)
    qk_norm = dataclasses.replace(cfg, qk_norm=True)
    with pytest.raises(ConfigError, match=r"^export to Llama4ForCausalLM cannot express model\.qk_norm=True") as e2:
        save_llama4(tmp_path / "normed", qk_norm, params)
    assert "\n" not in str(e.value) + str(e2.value)
    assert not (tmp_path / "biased").exists() and not (tmp_path / "normed").exists()


@pytest.mark.parametrize(
    "change, field",
    [
        ({"moe_layers": [0, 3]}, "moe_layers"),
        ({"layer_types": ["full_attention"] * 4}, "layer_types"),
        ({"interleave_moe_layer_step": 3}, "interleave_moe_layer_step"),
        ({"hidden_act": "gelu"}, "hidden_act"),
    ],
)
def test_unrepresentable_config_names_the_field(change, field):
    hf_config = {**decoder_config("llama4_text").to_dict(), **change}
    with pytest.raises(ValueError, match=field) as e:
        config_from_hf(hf_config, has_head=True)
    assert "\n" not in str(e.value)
