"""Mixture-of-experts interop against transformers' MixtralForCausalLM, Qwen2MoeForCausalLM (shared expert and its
gate, a dense layer by decoder_sparse_step), Qwen3MoeForCausalLM, OlmoeForCausalLM (q/k norm over the whole
projection) and GptOssForCausalLM (sinks, biases, clamped SwiGLU experts, a local layer): logits, greedy generation,
the export round trip, and `run.py import` / `export` of a folder with its
tokenizer (skipped without the `interop` extra)."""

import dataclasses
import functools
import json

import numpy as np
import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tiny_hf import (  # noqa: E402
    MOE,
    MOES,
    assert_logits_match,
    decoder_config,
    hf_greedy,
    random_decoder,
    torch_logits,
    txjax_logits,
)
from tiny_peft import assert_adapter_reads_back, peft_loaded  # noqa: E402

import run  # noqa: E402
from txjax.convert.moe import config_from_hf, config_to_hf, load_moe, params_to_hf, save_moe  # noqa: E402
from txjax.decode import generate  # noqa: E402
from txjax.experiment import load_workdir  # noqa: E402
from txjax.model.models import DecoderLM  # noqa: E402

EXPECTED = {  # (router, moe_norm_topk, num_shared_experts, moe_every, qk_norm, qk_norm_all_heads, qkv_bias)
    "mixtral": ("topk_then_softmax", False, 0, 1, False, False, False),
    "qwen2_moe": ("softmax_then_topk", False, 2, 2, False, False, True),
    "qwen3_moe": ("softmax_then_topk", True, 0, 1, True, False, False),
    "olmoe": ("softmax_then_topk", False, 0, 1, True, True, False),
    "gpt_oss": ("topk_then_softmax", False, 0, 1, False, False, False),
}
TOKENS = np.random.default_rng(0).integers(0, MOE["vocab_size"], (2, MOE["max_position_embeddings"]))


@pytest.fixture(scope="module")
def convert(tmp_path_factory):
    """kind -> (kind, transformers model, txjax's ModelConfig and params read from the folder it saved), each kind
    built once in the module."""

    @functools.cache
    def converted(kind: str):
        model, folder = random_decoder(kind), tmp_path_factory.mktemp(kind)
        model.save_pretrained(folder)
        return kind, model, *load_moe(folder)

    return converted


@pytest.fixture(scope="module", params=list(MOES))
def hf(request, convert):
    return convert(request.param)


def test_logits_match_transformers(hf):
    kind, model, cfg, params = hf
    got = (cfg.router, cfg.moe_norm_topk, cfg.num_shared_experts, cfg.moe_every, cfg.qk_norm, cfg.qk_norm_all_heads)
    assert (*got, cfg.qkv_bias) == EXPECTED[kind] and cfg.num_experts == 4 and cfg.experts_per_token == 2
    assert cfg.shared_expert_gate == (kind == "qwen2_moe")
    assert_logits_match(model, cfg, params, TOKENS)


def test_greedy_generation_matches_transformers(hf):
    _, model, cfg, params = hf
    prompt = TOKENS[0, :5].tolist()
    assert generate(DecoderLM(cfg), params, [prompt], max_new_tokens=24).ids[0] == hf_greedy(model, prompt, 24)


def test_export_round_trip(hf, tmp_path):
    kind, model, cfg, params = hf
    out = save_moe(tmp_path / "out", cfg, params)
    hf_config = json.loads((out / "config.json").read_text())
    assert hf_config["model_type"] == kind and config_from_hf(hf_config, has_head=True) == cfg
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    np.testing.assert_allclose(torch_logits(reloaded, TOKENS), torch_logits(model, TOKENS), atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "kind, change, field",
    [
        ("olmoe", {"clip_qkv": 8.0}, "clip_qkv"),
        ("qwen2_moe", {"decoder_sparse_step": 3}, "decoder_sparse_step"),
        ("qwen3_moe", {"mlp_only_layers": [1]}, "mlp_only_layers"),
        ("qwen2_moe", {"shared_expert_intermediate_size": 24}, "shared_expert_intermediate_size"),
        ("qwen2_moe", {"num_experts": 0}, "num_experts"),
        ("mixtral", {"hidden_act": "gelu"}, "hidden_act"),
        ("qwen3_moe", {"use_sliding_window": True}, "use_sliding_window"),
    ],
)
def test_unrepresentable_config_names_the_field(kind, change, field):
    hf_config = {**decoder_config(kind).to_dict(), "model_type": kind, **change}
    with pytest.raises(ValueError, match=field) as e:
        config_from_hf(hf_config, has_head=True)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "change, field",
    [
        ({"router": "sigmoid"}, "model.router"),
        ({"shared_expert_gate": False}, "model.shared_expert_gate"),  # Qwen2-MoE gates its shared expert
        (
            {"moe_norm_topk": False, "num_shared_experts": 0, "shared_expert_gate": False, "qkv_bias": False},
            "moe_norm_topk",
        ),
    ],
)
def test_unexportable_config_names_the_field(change, field):
    """A Qwen2-MoE config changed so that no architecture holds it (Mixtral's router renormalises its k gates)."""
    cfg = config_from_hf({**decoder_config("qwen2_moe").to_dict(), "model_type": "qwen2_moe"}, has_head=True)
    moe_every_1 = {"moe_every": 1} if "num_shared_experts" in change else {}
    with pytest.raises(ValueError, match=field) as e:
        config_to_hf(dataclasses.replace(cfg, **change, **moe_every_1))
    assert "\n" not in str(e.value)


def test_run_py_import_and_export_with_the_tokenizer(tmp_path, capsys):
    """A Qwen2-MoE folder with a byte-level BPE tokenizer: `run.py import` keeps its parameters, `run.py export`
    writes a folder transformers loads with the original logits."""
    tokenizers = pytest.importorskip("tokenizers")
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(["All: Speak, speak. First Citizen: you are all resolved rather to die."] * 20, 280)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer)
    model = random_decoder("qwen2_moe", vocab_size=bpe.get_vocab_size())  # byte-level: 256 ids and the merges
    model.save_pretrained(tmp_path / "hf")
    fast.save_pretrained(tmp_path / "hf")
    text = tmp_path / "text.txt"
    text.write_text("All: Speak, speak.\n" * 40)
    flags = [f"--config.data.path={text}", "--config.data.seq_len=16"]
    assert run.main(["import", f"--from={tmp_path / 'hf'}", f"--workdir={tmp_path / 'run'}", *flags]) == 0
    cfg, params = load_moe(tmp_path / "hf")
    loaded = load_workdir(tmp_path / "run")
    assert loaded.model.cfg == cfg
    np.testing.assert_array_equal(
        loaded.params["decoder"]["layers"]["block_1"]["ffn"]["shared_expert_gate"]["kernel"],
        params["decoder"]["layers"]["block_1"]["ffn"]["shared_expert_gate"]["kernel"],
    )
    capsys.readouterr()
    assert run.main(["export", f"--workdir={tmp_path / 'run'}", f"--to={tmp_path / 'out'}"]) == 0
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(json.loads(capsys.readouterr().out)["files"])
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    np.testing.assert_allclose(torch_logits(again, TOKENS), torch_logits(model, TOKENS), atol=1e-5, rtol=0)


def test_export_writes_topk_then_softmax_as_norm_topk_prob(convert, tmp_path):
    """Mixtral's router (a softmax over the top-k logits) in a Qwen3-MoE model is exported as norm_topk_prob (the
    top-k of the softmax renormalised: the same gates), and transformers gives txjax's logits."""
    _, _, cfg, params = convert("qwen3_moe")
    cfg = dataclasses.replace(cfg, router="topk_then_softmax", moe_norm_topk=False)
    out = save_moe(tmp_path / "out", cfg, params)
    assert json.loads((out / "config.json").read_text())["norm_topk_prob"] is True
    exported = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    want = txjax_logits(cfg, params, TOKENS)
    np.testing.assert_allclose(torch_logits(exported, TOKENS), want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("kind", ["mixtral", "qwen2_moe"])
def test_a_lora_adapter_on_the_experts_loads_in_peft_with_txjaxs_logits(kind, convert, tmp_path):
    """Mixtral (each expert's w1/w2/w3) and Qwen2-MoE (a dense layer 0, routed and shared experts): adapters on
    attention and every FFN, the routed experts' one pair per expert, written by txjax's peft writer and loaded by
    peft onto transformers' model (whose experts are fused tensors): txjax's merged model's logits within 1e-4; the
    folder read back onto the base is the same adapters."""
    pytest.importorskip("peft")
    _, model, cfg, params = convert(kind)
    adapted, merged = peft_loaded(model, DecoderLM(cfg), params, params_to_hf, tmp_path / "adapter")
    assert_logits_match(adapted, cfg, merged, TOKENS)
    assert np.abs(txjax_logits(cfg, merged, TOKENS) - txjax_logits(cfg, params, TOKENS)).max() > 1e-2
    assert_adapter_reads_back(tmp_path / "adapter", DecoderLM(cfg), params, params_to_hf, merged)
