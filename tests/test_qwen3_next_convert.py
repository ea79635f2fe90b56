"""Qwen3-Next (transformers' Qwen3NextForCausalLM) in and out: a tiny random model of Gated DeltaNet layers (2 key
heads for 4 value heads) alternating with gated full attention (partial RoPE, q/k norms, zero-centred RMSNorms) and
dense / MoE layers (a gated shared expert): logits within 1e-4 of transformers', 40 greedy tokens equal (cached
decoding through the delta rule's state and the KV cache), the export reloaded by transformers with the same logits,
`run.py import` / `export` of its folder, the multi-token-prediction weights left out, and what txjax cannot
represent refused in one line."""

import dataclasses
import functools
import json

import jax
import numpy as np
import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tiny_hf import QWEN3_NEXT, assert_logits_match, decoder_config, hf_greedy, save_decoder, torch_logits  # noqa: E402

import run  # noqa: E402
from txjax.convert import exportable, hf_folder  # noqa: E402
from txjax.convert.qwen3_next import (  # noqa: E402
    config_from_hf,
    config_to_hf,
    load_qwen3_next,
    params_from_hf,
    save_qwen3_next,
)
from txjax.decode import generate  # noqa: E402
from txjax.experiment import load_workdir  # noqa: E402
from txjax.model.config import ModelConfig  # noqa: E402
from txjax.model.models import DecoderLM  # noqa: E402

TOKENS = np.random.default_rng(0).integers(0, QWEN3_NEXT["vocab_size"], (2, QWEN3_NEXT["max_position_embeddings"]))


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    """(transformers model, its folder, txjax's ModelConfig and params read from it)."""
    folder = tmp_path_factory.mktemp("qwen3_next")
    model = save_decoder("qwen3_next", folder)
    return model, folder, *load_qwen3_next(folder)


def test_logits_match_transformers(hf):
    """In float32 at the default chunk (one chunk of 48 here): the chunked delta rule's decays summed between tokens
    rather than as differences of cumulative sums (gated_deltanet.chunked_delta_rule) keep its rounding below
    transformers' own (whose float32 is 6e-5 from its float64), under XLA's default and the suite's -O0 alike."""
    model, _, cfg, params = hf
    assert (cfg.layer_types, cfg.linear_heads, cfg.linear_v_heads, cfg.linear_head_dim, cfg.linear_v_head_dim) == (
        "LF",
        2,
        4,
        8,
        6,
    )
    assert (cfg.attention_output_gate, cfg.rope_fraction, cfg.qk_norm, cfg.norm_offset) == (True, 0.25, True, True)
    assert (cfg.num_experts, cfg.moe_every, cfg.num_shared_experts, cfg.shared_expert_gate) == (4, 2, 1, True)
    assert (cfg.router, cfg.moe_norm_topk) == ("softmax_then_topk", True)
    assert cfg.linear_chunk > TOKENS.shape[1]
    assert_logits_match(model, cfg, params, TOKENS)


def test_greedy_generation_matches_transformers(hf):
    model, _, cfg, params = hf
    prompt = TOKENS[0, :5].tolist()
    assert generate(DecoderLM(cfg), params, [prompt], max_new_tokens=40).ids[0] == hf_greedy(model, prompt, 40)


def test_export_round_trip(hf, tmp_path):
    """A model's own chunk length (how it computes, not what) is not the folder's: it reads back as the default."""
    model, _, cfg, params = hf
    out = save_qwen3_next(tmp_path / "out", dataclasses.replace(cfg, linear_chunk=16), params)
    hf_config = json.loads((out / "config.json").read_text())
    assert hf_config["architectures"] == ["Qwen3NextForCausalLM"] and config_from_hf(hf_config, has_head=True) == cfg
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    np.testing.assert_allclose(torch_logits(reloaded, TOKENS), torch_logits(model, TOKENS), atol=1e-5, rtol=0)


def test_linear_sizes_taken_from_the_attention_are_exported():
    """A linear layer's size 0 (the attention's) is written as the size it gives and reads back as that size."""
    cfg = config_from_hf(decoder_config("qwen3_next").to_dict(), has_head=True)
    own = dataclasses.replace(cfg, linear_heads=0, linear_head_dim=0, linear_v_head_dim=0)
    hf_config = config_to_hf(own)
    assert [hf_config[f"linear_{name}"] for name in ("num_key_heads", "key_head_dim", "value_head_dim")] == [4, 16, 16]
    exportable.check_fields(own, hf_config, functools.partial(config_from_hf, has_head=True))


def test_run_py_import_and_export(hf, tmp_path):
    """The folder imported into a workdir keeps its parameters; `run.py export` picks the Qwen3-Next writer."""
    _, folder, cfg, _ = hf
    assert run.main(["import", f"--from={folder}", f"--workdir={tmp_path / 'run'}"]) == 0
    assert load_workdir(tmp_path / "run").model.cfg == cfg
    assert run.main(["export", f"--workdir={tmp_path / 'run'}", f"--to={tmp_path / 'out'}"]) == 0
    assert json.loads((tmp_path / "out" / "config.json").read_text())["model_type"] == "qwen3_next"


def test_multi_token_prediction_weights_are_left_out(hf):
    _, folder, cfg, params = hf
    tensors = hf_folder.read_tensors(folder) | {"mtp.fc.weight": np.ones((32, 64), np.float32)}
    same = params_from_hf(tensors, cfg)
    assert jax.tree.all(jax.tree.map(np.array_equal, same, params))


@pytest.mark.parametrize(
    "change, field",
    [
        ({"mlp_only_layers": [1]}, "mlp_only_layers"),
        ({"layer_types": ["linear_attention", "sliding_attention"] * 2}, "layer_types"),
        ({"shared_expert_intermediate_size": 24}, "shared_expert_intermediate_size"),
        ({"hidden_act": "gelu"}, "hidden_act"),
    ],
)
def test_unrepresentable_config_names_the_field(change, field):
    hf_config = {**decoder_config("qwen3_next").to_dict(), **change}
    with pytest.raises(ValueError, match=field) as e:
        config_from_hf(hf_config, has_head=True)
    assert "\n" not in str(e.value)


def test_the_output_gate_is_refused_where_nothing_reads_it():
    """Multi-head latent attention has no output gate: one line naming the fix; a gate that is not a bool too."""
    mla = dict(positional="rope", attention="mla", kv_lora_rank=6, qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=3)
    with pytest.raises(
        ValueError, match=r"^model.attention=mla has no form for this: set .*attention_output_gate=false"
    ):
        ModelConfig(vocab_size=8, d_model=16, num_heads=2, attention_output_gate=True, **mla)
    with pytest.raises(ValueError, match=r"^model.attention_output_gate='yes' must be true or false$"):
        ModelConfig(vocab_size=8, d_model=16, num_heads=2, attention_output_gate="yes")
