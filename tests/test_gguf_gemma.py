"""Gemma 2 and Gemma 3 (text) .gguf files as llama.cpp's converter writes them (tests/tiny_gguf.py: norm gains
stored as 1 + w, a SentencePiece vocabulary without merges) against the Hugging Face folder import of the same tiny
random model (tests/tiny_hf.py's builders) and transformers: the same ModelConfig, the same parameters,
logits within 1e-4 of transformers past the sliding window, the same greedy tokens, the tokenizer giving
GemmaTokenizer's ids; what llama.cpp's metadata leaves to its own rules (the score scale, which layers are local,
Gemma 3's local RoPE base) read as llama.cpp reads it, and what txjax cannot represent refused in one line."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from tiny_gguf import finish, sentencepiece_bpe, write_gguf  # noqa: E402
from tiny_hf import hf_greedy, random_decoder  # noqa: E402

import run  # noqa: E402
from txjax.convert.gemma import load_gemma  # noqa: E402
from txjax.convert.gguf import GGUFFile, config_from_gguf, load_gguf  # noqa: E402
from txjax.decode import generate  # noqa: E402
from txjax.experiment import load_workdir  # noqa: E402
from txjax.model.models import DecoderLM  # noqa: E402

TEXT = "ROMEO: what light through yonder window breaks? the quick brown fox, 42!"  # ',', '4', '2', '!': bytes


@pytest.fixture(scope="module")
def spm():
    return sentencepiece_bpe()


def logits(cfg, params, ids):
    return np.asarray(DecoderLM(cfg).apply({"params": params}, jnp.asarray([ids])))[0]


@pytest.mark.parametrize("kind, arch", [("gemma2", "gemma2"), ("gemma3_text", "gemma3")])
def test_gemma_gguf_equals_the_folder_import_and_transformers(spm, tmp_path, kind, arch):
    """Gemma 2 (alternating layers, both soft caps, query_pre_attn_scalar 24 through {arch}.attention.scale, tied)
    and Gemma 3 (5:1 layers, q/k norms, linear x8 global RoPE and local base 1e4, untied), F32 (the quantized types'
    dequantizing is test_gguf.py's)."""
    model = random_decoder(kind, vocab_size=len(spm["tokens"]))
    model.save_pretrained(tmp_path / "hf")
    scale = model.config.query_pre_attn_scalar**-0.5 if kind == "gemma2" else None  # gemma3: 16 = head_dim
    path = write_gguf(tmp_path / "m.gguf", model, spm, arch, gguf.GGMLQuantizationType.F32, attention_scale=scale)
    cfg, params, tok = load_gguf(path)
    want_cfg, want_params = load_gemma(tmp_path / "hf")
    np.testing.assert_allclose(cfg.norm_eps, want_cfg.norm_eps, rtol=1e-6)  # stored as float32
    assert dataclasses.replace(cfg, norm_eps=want_cfg.norm_eps) == want_cfg
    assert (cfg.window_pattern, cfg.attention_scale_dim, cfg.rope_local_base) == {
        "gemma2": ("LG", 24, 0.0),
        "gemma3_text": ("LLLLLG", 0, 1e4),
    }[kind]
    # the gains come back as (1 + w) - 1 in float32, all else bit for bit
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6, rtol=0), params, want_params)
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, 40).tolist()  # past the windows of 6 and 8
    with torch.no_grad():
        hf = model(torch.tensor([ids])).logits[0].numpy()
    assert np.abs(hf).max() > 3.0
    np.testing.assert_allclose(logits(cfg, params, ids), hf, atol=1e-4, rtol=0)

    prompt = ids[:5]  # 5 + 12 tokens: past the windows
    assert generate(DecoderLM(cfg), params, [prompt], max_new_tokens=12).ids[0] == hf_greedy(model, prompt, 12)

    # the tokenizer: GemmaTokenizer's ids from the vocabulary and the merges the trainer learned (the file has none)
    ref_tok = transformers.GemmaTokenizer(
        vocab={t: i for i, t in enumerate(spm["tokens"])}, merges=[tuple(m.split(" ")) for m in spm["merges"]]
    )
    text_ids = tok.encode(TEXT)
    assert text_ids == ref_tok(TEXT, add_special_tokens=False).input_ids and tok.decode(text_ids) == TEXT
    assert spm["tokens"].index("<0x2C>") in text_ids  # ',' by byte fallback
    assert (tok.token(tok.bos_id), tok.token(tok.eos_id), tok.add_bos) == ("<bos>", "<eos>", True)


def metadata_only(path, arch, tokenizer="llama", **changes):
    """A .gguf file of gemma2/gemma3 metadata (d_model 32, 4 heads of 16: d_model / heads = 8, 2 layers) and a
    3-token vocabulary, no tensors: enough for config_from_gguf; changes: {key without the arch prefix: value, None:
    removed}."""
    keys = {
        "context_length": 64,
        "embedding_length": 32,
        "block_count": 2,
        "feed_forward_length": 64,
        "attention.head_count": 4,
        "attention.head_count_kv": 2,
        "attention.key_length": 16,
        "attention.layer_norm_rms_epsilon": 1e-6,
        "attention.sliding_window": 8,
        "rope.freq_base": 1e6,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
    } | changes
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in keys.items():
        if isinstance(value, str):
            w.add_string(f"{arch}.{key}", value)
        elif isinstance(value, list):
            w.add_array(f"{arch}.{key}", value)
        elif isinstance(value, float):
            w.add_float32(f"{arch}.{key}", value)
        elif value is not None:
            w.add_uint32(f"{arch}.{key}", value)
    w.add_tokenizer_model(tokenizer)
    w.add_token_list(["<pad>", "<eos>", "<bos>"])
    finish(w)
    return path


def test_what_the_metadata_leaves_out_is_read_as_llama_cpp_reads_it(tmp_path):
    """llama.cpp's rules: the 27B models (46 / 62 layers) scale scores by 1/sqrt(d_model / heads), the others by
    1/sqrt(head_dim); every 2nd (Gemma 2) / 6th (Gemma 3) layer global unless sliding_window_pattern says;
    Gemma 3's local base 1e4 unless rope.freq_base_swa says; no window: every layer global."""

    def cfg(arch, **changes):
        return config_from_gguf(GGUFFile(metadata_only(tmp_path / "m.gguf", arch, **changes)), has_head=False)

    assert cfg("gemma2").attention_scale_dim == 0  # 1/sqrt(head_dim)
    assert cfg("gemma2", block_count=46).attention_scale_dim == 8  # as Gemma 2 27B's 4608 / 32 = 144
    assert cfg("gemma3", block_count=62).attention_scale_dim == 8  # as Gemma 3 27B's 5376 / 32 = 168
    assert cfg("gemma3", block_count=26).attention_scale_dim == 0
    assert cfg("gemma2", **{"attention.scale": 0.125}).attention_scale_dim == 64

    g3 = cfg("gemma3", block_count=8)
    assert (g3.window_pattern, g3.layer_windows) == ("LLLLLG", (8,) * 5 + (0, 8, 8))
    assert (g3.rope_local_base, g3.rope_base) == (1e4, 1e6)
    assert (g3.attention_softcap, g3.logit_softcap, g3.qk_norm) == (0.0, 30.0, True)  # Gemma 3: no attention cap
    assert cfg("gemma3", **{"rope.freq_base_swa": 5e4}).rope_local_base == 5e4
    assert cfg("gemma3", **{"attention.sliding_window_pattern": 2}).window_pattern == "LG"
    assert cfg("gemma3", **{"attention.sliding_window_pattern": 0}).layer_windows == (8, 8)  # 0: every layer local
    flags = cfg("gemma3", block_count=3, **{"attention.sliding_window_pattern": [True, False, True]})
    assert flags.layer_windows == (8, 0, 8)
    assert cfg("gemma3", **{"attention.sliding_window": None}).layer_windows == (0, 0)
    g2 = cfg("gemma2", block_count=4)
    assert (g2.window_pattern, g2.attention_softcap, g2.logit_softcap, g2.rope_local_base) == ("LG", 50.0, 30.0, 0.0)
    linear = cfg("gemma3", **{"rope.scaling.type": "linear", "rope.scaling.factor": 8.0})
    assert (linear.rope_scaling, linear.rope_factor) == ("linear", 8.0)


@pytest.mark.parametrize(
    "arch, changes, message",
    [
        ("gemma2", {"attention.scale": 0.3}, "gemma2.attention.scale=0.3"),
        ("gemma3", {"rope.scaling.type": "yarn"}, "gemma3.rope.scaling.type='yarn'"),
        ("gemma2", {"attn_logit_softcapping": None}, "'gemma2.attn_logit_softcapping' is missing"),
        ("gemma3", {"rope.dimension_count": 8}, "gemma3.rope.dimension_count=8"),
        ("gemma3", {"attention.sliding_window_pattern": [True]}, "1 flags, 2 layers"),
        ("gemma2", {"tokenizer": "bert"}, "tokenizer.ggml.model='bert'"),
        ("gemma3", {}, "the vocabulary of 3 tokens lacks <unk>, <mask> (the gemma3 tokenizer's)"),
    ],
)
def test_what_txjax_cannot_represent_is_one_line(tmp_path, capsys, arch, changes, message):
    source, workdir = metadata_only(tmp_path / "m.gguf", arch, **changes), tmp_path / "run"
    assert run.main(["import", f"--from={source}", f"--workdir={workdir}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err, err
    assert not workdir.exists()


def test_run_py_imports_a_quantized_gemma_file_and_exports_it(spm, tmp_path):
    """`run.py import` of a Q8_0 Gemma 2 file writes a workdir (tokenizer included) whose `run.py export` folder
    transformers loads as gemma2 with the workdir's logits, and with a tokenizer that writes a text as transformers'
    tokenizer of the file does (<bos> first: llama.cpp's rule for a SentencePiece vocabulary)."""
    model = random_decoder("gemma2", vocab_size=len(spm["tokens"]))
    scale = model.config.query_pre_attn_scalar**-0.5
    path = write_gguf(tmp_path / "m.gguf", model, spm, "gemma2", gguf.GGMLQuantizationType.Q8_0, attention_scale=scale)
    (tmp_path / "text.txt").write_text(TEXT * 20)
    flags = [f"--config.data.path={tmp_path / 'text.txt'}", "--config.data.seq_len=16"]
    assert run.main(["import", f"--from={path}", f"--workdir={tmp_path / 'wd'}", *flags]) == 0
    assert run.main(["export", f"--workdir={tmp_path / 'wd'}", f"--to={tmp_path / 'out'}"]) == 0
    trained = load_workdir(tmp_path / "wd")
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert reloaded.config.model_type == "gemma2" and reloaded.config.query_pre_attn_scalar == 24
    want_ids = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file="m.gguf")(TEXT).input_ids
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "out")(TEXT).input_ids == want_ids
    assert want_ids[0] == trained.tokenizer.bos_id
    ids = np.random.default_rng(1).integers(0, len(spm["tokens"]), (1, 24))
    with torch.no_grad():
        want = reloaded(torch.as_tensor(ids)).logits.numpy()
    got = np.asarray(trained.model.apply({"params": trained.params}, ids))
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    with torch.no_grad():  # Q8_0's rounding: near the original model, not equal
        original = model(torch.as_tensor(ids)).logits.numpy()
    assert 0 < np.abs(got - original).max() < 0.5
