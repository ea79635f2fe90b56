"""Export is whole or refused (txjax/convert/exportable.py): a field the target format cannot express, or a parameter
its writer does not read, is one line naming every one of them, exit status 2, no folder; a model the format
holds exports and reads back to the same parameters. Needs no extra: the workdir is trained here, the folders read
back with txjax's own readers."""

import dataclasses
import functools
import json
import shutil

import jax
import numpy as np
import pytest
from test_train import TINY_FLAGS

import run
from txjax.convert import gemma, gpt2, hf_folder, llama, moe
from txjax.convert import workdir as workdir_lib
from txjax.errors import ConfigError
from txjax.experiment import load_workdir
from txjax.families import DECODER_LM, init_params
from txjax.model.config import ModelConfig
from txjax.model.models import stack_layers

LLAMA_SHAPE = [
    "--config.model.positional=rope",
    "--config.model.norm=rmsnorm",
    "--config.model.activation=swiglu",
    "--config.model.num_layers=2",
    "--config.model.num_kv_heads=1",
]
SMALL = dict(vocab_size=40, d_model=32, num_heads=4, d_ff=64, num_layers=2, max_len=16)
LLAMA = ModelConfig(**SMALL, positional="rope", norm="rmsnorm", activation="swiglu", tie_embeddings=False)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A workdir of a Llama-shaped DecoderLM trained a few steps (RoPE, RMSNorm, SwiGLU, grouped-query attention)."""
    workdir = tmp_path_factory.mktemp("export") / "llama"
    assert run.main(["train", f"--workdir={workdir}", *TINY_FLAGS, *LLAMA_SHAPE]) == 0
    return workdir


def changed(workdir, tmp_path, **fields):
    """A copy of the workdir whose model section has `fields` (as if trained with them: neither adds a parameter)."""
    copy = tmp_path / "changed"
    shutil.copytree(workdir, copy)
    config = json.loads((copy / "config.json").read_text())
    config["model"].update(fields)
    (copy / "config.json").write_text(json.dumps(config))
    return copy


def export(workdir, target, capsys) -> tuple[int, str]:
    """run.py export's exit status and its stderr."""
    capsys.readouterr()
    status = run.main(["export", f"--workdir={workdir}", f"--to={target}"])
    return status, capsys.readouterr().err


def test_a_model_llama_holds_exports_whole(trained, tmp_path, capsys):
    status, _ = export(trained, tmp_path / "out", capsys)
    assert status == 0
    cfg, params = llama.load_llama(tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    assert cfg.kv_heads == 1 and cfg.num_layers == 2
    jax.tree.map(np.testing.assert_array_equal, params, jax.device_get(load_workdir(trained).params))


def test_fields_llama_cannot_express_are_refused_in_one_line(trained, tmp_path, capsys):
    """The issue's case: model.norm_offset and attention_softcap (Gemma's) on a Llama-shaped model were written as a
    plain LlamaForCausalLM, exit 0; now both are named at once, and nothing is written."""
    workdir = changed(trained, tmp_path, norm_offset=True, attention_softcap=0.5)
    status, err = export(workdir, tmp_path / "out", capsys)
    assert status == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert err.startswith("error: export to LlamaForCausalLM cannot express ")
    assert "model.norm_offset=True" in err and "model.attention_softcap=0.5" in err
    assert "nothing was written" in err
    assert not (tmp_path / "out").exists()


def _with_sinks(params):
    """params with a leaf decoder/layers/self_attention/sinks [layers, heads] (an attention-sinks parameter)."""
    layers = dict(params["decoder"]["layers"])
    attention = dict(layers["self_attention"])
    attention["sinks"] = np.ones((2, 2), np.float32)  # TINY_FLAGS: 2 heads; LLAMA_SHAPE: 2 layers
    layers["self_attention"] = attention
    return {**params, "decoder": {**params["decoder"], "layers": layers}}


def test_a_parameter_the_writer_does_not_read_is_refused(trained, tmp_path, capsys, monkeypatch):
    """A model whose code gained a parameter (the model's tree has it, the checkpoint holds it) that the Llama writer
    does not know: the export names the leaf instead of dropping it."""
    run_ = load_workdir(trained)
    monkeypatch.setattr(workdir_lib, "load_workdir", lambda *a, **k: run_._replace(params=_with_sinks(run_.params)))
    monkeypatch.setattr(hf_folder, "init_params", lambda *a: _with_sinks(init_params(*a)))
    hf_folder.expected_shapes.cache_clear()
    try:
        status, err = export(trained, tmp_path / "out", capsys)
    finally:
        hf_folder.expected_shapes.cache_clear()
    assert status == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert err.startswith("error: parameter decoder/layers/self_attention/sinks has no place in a LlamaForCausalLM")
    assert not (tmp_path / "out").exists()


@functools.cache  # the tests ask for one config's parameters two or three times
def _params(cfg):
    """The config's initial parameters, jitted (op by op, a model's init compiled each of its hundreds of ops)."""
    return jax.device_get(jax.jit(lambda: init_params(DECODER_LM.module(cfg), jax.random.key(0)))())


def test_an_moe_with_norm_offset_is_refused_as_mixtral(tmp_path):
    """The issue's MoE case: norm_offset on an MoE exported as Mixtral; the same MoE without it writes a folder that
    reads back to its parameters."""
    cfg = dataclasses.replace(LLAMA, num_experts=4)
    back_cfg, back = moe.load_moe(moe.save_moe(tmp_path / "plain", cfg, _params(cfg)))
    assert back_cfg.num_experts == 4
    jax.tree.map(np.testing.assert_array_equal, back, _params(cfg))
    offset = dataclasses.replace(cfg, norm_offset=True)
    with pytest.raises(ConfigError, match=r"^export to MixtralForCausalLM cannot express model\.norm_offset=True \("):
        moe.save_moe(tmp_path / "out", offset, _params(offset))
    assert not (tmp_path / "out").exists()


GPT2 = ModelConfig(**SMALL, use_bias=True, activation="gelu_tanh")
GEMMA = dataclasses.replace(
    LLAMA, norm_placement="sandwich", norm_offset=True, activation="geglu", embed_scale=True, tie_embeddings=True
)


@pytest.mark.parametrize(
    "save, cfg, target, field",
    [
        (gpt2.save_gpt2, dataclasses.replace(GPT2, attention_softcap=0.5), "GPT2LMHeadModel", "attention_softcap=0.5"),
        (
            llama.save_llama,
            dataclasses.replace(LLAMA, attention_scale_dim=4),
            "LlamaForCausalLM",
            "attention_scale_dim=4",
        ),
        (llama.save_llama, dataclasses.replace(LLAMA, rope_fraction=0.5), "LlamaForCausalLM", "rope_fraction=0.5"),
        (gemma.save_gemma, dataclasses.replace(GEMMA, rope_fraction=0.5), "Gemma2ForCausalLM", "rope_fraction=0.5"),
        (
            moe.save_moe,
            dataclasses.replace(LLAMA, num_experts=4, attention_softcap=0.5),
            "MixtralForCausalLM",
            "attention_softcap=0.5",
        ),
    ],
)
def test_each_decoder_writer_refuses_a_field_it_cannot_express(save, cfg, target, field, tmp_path):
    """Each writer goes through exportable.checked: a field its format lacks is named (the encoder-decoders':
    tests/test_seq2seq_convert.py), and the same model without it is written."""
    with pytest.raises(ConfigError, match=rf"^export to {target} cannot express [^(]*model\.{field}"):
        save(tmp_path / "out", cfg, _params(cfg))
    assert not (tmp_path / "out").exists()
    plain = dataclasses.replace(cfg, **{f: getattr(ModelConfig(1), f) for f in (field.split("=")[0],)})
    assert (save(tmp_path / "plain", plain, _params(plain)) / "model.safetensors").is_file()


@pytest.mark.parametrize(
    "cfg",
    [
        dataclasses.replace(LLAMA, dtype="bfloat16", scan_layers=False, remat=True, dropout=0.1, init_std=0.1),
        dataclasses.replace(LLAMA, num_kv_heads=4, d_head=8),  # the values None stands for, spelt out
        dataclasses.replace(LLAMA, attention_window=16),  # a window as long as the context: global
        dataclasses.replace(LLAMA, num_experts=4, router="softmax_then_topk", moe_norm_topk=True),  # Mixtral's gates
        dataclasses.replace(LLAMA, num_experts=4, moe_capacity_factor=1.0),  # written as dropless routing
    ],
)
def test_settings_of_the_same_function_are_not_refused(cfg, tmp_path):
    """Export compares the function, not the spelling: execution fields (exportable.EXECUTION_FIELDS) and a setting
    spelt another way with the same result are written (and read back to the same parameters)."""
    save, load = (moe.save_moe, moe.load_moe) if cfg.num_experts else (llama.save_llama, llama.load_llama)
    params = _params(cfg)
    _, back = load(save(tmp_path / "out", cfg, params))  # read back scanned
    jax.tree.map(np.testing.assert_array_equal, back, params if cfg.scan_layers else stack_layers(params))
