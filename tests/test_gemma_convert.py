"""Gemma 2 and Gemma 3 (text) interop against transformers' PyTorch Gemma2ForCausalLM and Gemma3ForCausalLM on tiny
random models (tests/tiny_hf.py): `run.py import` -> logits within 1e-4 (reference and blockwise attention) and the
same 40 greedy tokens as transformers.generate (past the sliding window), `run.py export` -> transformers loads the
folder and gives the same logits, a LoRA adapter on Gemma 3 loads in peft with txjax's logits and tokens and reads
back, and a config txjax cannot represent is one line naming the field (skipped without the `interop` extra)."""

import dataclasses
import json
import shutil

import numpy as np
import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from tiny_hf import GEMMA, GEMMAS, assert_logits_match, hf_greedy, save_decoder, torch_logits, txjax_logits  # noqa: E402
from tiny_peft import assert_adapter_reads_back, peft_loaded  # noqa: E402

import run  # noqa: E402
from txjax.convert.gemma import config_from_hf, params_to_hf, window_pattern  # noqa: E402
from txjax.decode import generate  # noqa: E402
from txjax.experiment import load_workdir  # noqa: E402
from txjax.model.config import ModelConfig  # noqa: E402
from txjax.model.models import DecoderLM  # noqa: E402

NEW_TOKENS = 40


@pytest.fixture(scope="module", params=list(GEMMAS))
def imported(request, tmp_path_factory):
    """(kind, transformers model, the workdir `run.py import` wrote, root)"""
    root = tmp_path_factory.mktemp(request.param)
    model = save_decoder(request.param, root / "hf")
    assert run.main(["import", f"--from={root / 'hf'}", f"--workdir={root / 'wd'}", "--config.data.seq_len=16"]) == 0
    return request.param, model, root / "wd", root


def tokens(vocab):
    return np.random.default_rng(0).integers(0, vocab, (2, GEMMA["max_position_embeddings"]))


def test_import_logits_and_greedy_tokens_match_transformers(imported):
    kind, model, workdir, _ = imported
    trained = load_workdir(workdir)
    cfg = trained.model.cfg
    assert (cfg.qk_norm, cfg.norm_placement, cfg.norm_offset) == (kind == "gemma3_text", "sandwich", True)
    assert cfg.window_pattern == {"gemma2": "LG", "gemma3_text": "LLLLLG"}[kind]
    ids = tokens(cfg.vocab_size)
    ref = torch_logits(model, ids)
    assert np.abs(ref).max() > 3.0  # not a trivially small signal
    got = np.asarray(trained.model.apply({"params": trained.params}, ids))
    np.testing.assert_allclose(got, ref, atol=1e-4, rtol=0)
    blocks = dataclasses.replace(cfg, attention_impl="blockwise", attention_block_q=16, attention_block_kv=16)
    blockwise = np.asarray(DecoderLM(blocks).apply({"params": trained.params}, ids))  # soft caps, windows by blocks
    np.testing.assert_allclose(blockwise, ref, atol=1e-4, rtol=0)
    prompt = ids[0, :5].tolist()
    out = generate(trained.model, trained.params, [prompt], max_new_tokens=NEW_TOKENS)
    assert out.ids[0] == hf_greedy(model, prompt, NEW_TOKENS)  # 45 tokens: past the window of 6 / 8


def test_export_round_trip(imported):
    kind, model, workdir, root = imported
    assert run.main(["export", f"--workdir={workdir}", f"--to={root / 'out'}"]) == 0
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(root / "out").eval()
    assert reloaded.config.model_type == kind
    ids = tokens(model.config.vocab_size)
    np.testing.assert_allclose(torch_logits(reloaded, ids), torch_logits(model, ids), atol=1e-5, rtol=0)


@pytest.mark.parametrize("imported", ["gemma3_text"], indirect=True)
def test_a_lora_adapter_loads_in_peft_with_txjaxs_logits_and_reads_back(imported, tmp_path):
    """Gemma 3 (q/k norms, the scaled embedding, sliding-window layers): txjax's peft export of adapters on every
    projection, loaded by peft onto transformers' model, gives txjax's merged model's logits within 1e-4 and its 40
    greedy tokens; the folder read back onto the imported base is the same adapters (txjax.convert.peft_adapter)."""
    pytest.importorskip("peft")
    _, model, workdir, _ = imported
    base = load_workdir(workdir)
    cfg, ids = base.model.cfg, tokens(base.model.cfg.vocab_size)
    adapted, merged = peft_loaded(model, base.model, base.params, params_to_hf, tmp_path / "adapter")
    assert_logits_match(adapted, cfg, merged, ids)
    assert np.abs(txjax_logits(cfg, merged, ids) - txjax_logits(cfg, base.params, ids)).max() > 1e-2
    prompt = ids[0, :5].tolist()
    out = generate(base.model, merged, [prompt], max_new_tokens=NEW_TOKENS)
    assert out.ids[0] == hf_greedy(adapted, prompt, NEW_TOKENS)
    assert_adapter_reads_back(tmp_path / "adapter", base.model, base.params, params_to_hf, merged)


def test_layer_types_not_one_per_layer_are_one_line_as_transformers_refuses_them(imported, tmp_path, capsys):
    """config.json's layer_types cut to a third (2 entries for Gemma 3's 6 layers, 1 for Gemma 2's 2): transformers
    refuses the folder, and so does the import, in one line naming the field and both counts, before writing."""
    kind, _, _, root = imported
    folder = tmp_path / "hf"
    shutil.copytree(root / "hf", folder)
    hf = json.loads((folder / "config.json").read_text())
    layers, hf["layer_types"] = hf["num_hidden_layers"], hf["layer_types"][: hf["num_hidden_layers"] // 3 or 1]
    (folder / "config.json").write_text(json.dumps(hf))
    with pytest.raises(Exception, match=rf"\({layers}\) must be equal to the number of `layer_types`"):
        transformers.AutoConfig.from_pretrained(folder)  # huggingface_hub's StrictDataclassClassValidationError
    assert run.main(["import", f"--from={folder}", f"--workdir={tmp_path / 'wd'}"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"error: config.json: layer_types has {len(hf['layer_types'])} entries for num_hidden_layers={layers} "
        "(one per layer)"
    ]
    assert not (tmp_path / "wd").exists()


def test_layer_types_become_the_shortest_window_pattern():
    local, full = "sliding_attention", "full_attention"
    assert window_pattern([local, full] * 3) == "LG"
    assert window_pattern(([local] * 5 + [full]) * 4 + [local] * 2) == "LLLLLG"  # 26 layers: Gemma 3 1B's
    assert window_pattern([local] * 4) == ""  # every layer local: window_pattern's default
    assert window_pattern([full, local, local]) == "GLL"


GEMMA2 = {**GEMMA, "model_type": "gemma2", "vocab_size": 64}


def test_older_config_json_fields():
    """The Hub's configs from before transformers 5: top-level rope_theta / rope_scaling / rope_local_base_freq and
    sliding_window_pattern instead of rope_parameters and layer_types (Gemma 3 4B's text model; Gemma 2's)."""
    gemma3 = {**GEMMA2, "model_type": "gemma3_text", "num_hidden_layers": 8, "sliding_window": 1024}
    gemma3 |= {"rope_theta": 1e6, "rope_local_base_freq": 1e4, "rope_scaling": {"rope_type": "linear", "factor": 8.0}}
    cfg = config_from_hf(gemma3 | {"sliding_window_pattern": 6, "query_pre_attn_scalar": 256}, has_head=False)
    assert (cfg.window_pattern, cfg.attention_window, cfg.layer_windows[4:]) == ("LLLLLG", 1024, (1024, 0, 1024, 1024))
    assert (cfg.rope_base, cfg.rope_scaling, cfg.rope_factor, cfg.rope_local_base) == (1e6, "linear", 8.0, 1e4)
    assert (cfg.attention_scale_dim, cfg.qk_norm, cfg.tie_embeddings) == (256, True, True)
    old2 = {**GEMMA2, "num_hidden_layers": 4, "sliding_window": 4096, "rope_theta": 1e4, "query_pre_attn_scalar": 16}
    cfg = config_from_hf(old2 | {"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0}, has_head=False)
    assert (cfg.window_pattern, cfg.attention_scale_dim, cfg.rope_local_base) == ("LG", 0, 0.0)
    assert (cfg.attention_softcap, cfg.logit_softcap) == (50.0, 30.0)


@pytest.mark.parametrize(
    "change, field",
    [
        ({"model_type": "gemma3"}, "model_type"),
        ({"hidden_activation": "gelu"}, "hidden_activation"),
        ({"attention_bias": True}, "attention_bias"),
        ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
        ({"layer_types": ["sliding_attention", "chunked_attention"]}, "layer_types"),
        ({"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}}, "rope_type"),
        (
            {
                "model_type": "gemma3_text",
                "rope_parameters": {
                    "full_attention": {"rope_type": "default", "rope_theta": 1e6},
                    "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4},
                },
            },
            "sliding_attention",
        ),
    ],
)
def test_unrepresentable_config_names_the_field(change, field):
    with pytest.raises(ValueError, match=field) as e:
        config_from_hf({**GEMMA2, **change}, has_head=False)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "fields, named",
    [
        (dict(attention_softcap=50.0, attention_impl="fused"), "attention_impl"),
        (dict(attention_softcap=-1.0), "attention_softcap"),
        (dict(norm_offset=True), "norm_offset"),  # a LayerNorm model
        (dict(attention_scale_dim=24, attention_scale="none"), "attention_scale_dim"),
    ],
)
def test_model_config_refuses_what_no_path_computes(fields, named):
    with pytest.raises(ValueError, match=named) as e:
        ModelConfig(vocab_size=8, **fields)
    assert "\n" not in str(e.value)
