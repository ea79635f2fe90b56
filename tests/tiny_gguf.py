"""GGUF files of tiny transformers models written with gguf.GGUFWriter as llama.cpp's converter (convert_hf_to_gguf)
writes them: its metadata (one table of keys per architecture), its tensor names, the llama architecture's Q/K rows
interleaved, Llama 3's rope scaling as the rope_freqs tensor; with a byte-level BPE whose vocabulary and merges go
into the metadata. Gemma 2 / 3 files as its Gemma2Model / Gemma3Model write them: norm gains stored as 1 + w, a
SentencePiece vocabulary (tokens, scores, token types, no merges). What tests/test_gguf.py, tests/test_gguf_gemma.py
and benchmarks/convert_equality.py share; it imports gguf and tokenizers, so a test importorskips them first."""

from __future__ import annotations

import json

import gguf
import numpy as np
import tokenizers

from txjax.convert.gguf import _NAMES
from txjax.convert.gguf_gemma import NAMES as GEMMA_NAMES

TEXT = "the quick brown fox jumps over the lazy dog; ROMEO: what light through yonder window breaks?\n" * 20
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
GEMMA_ARCHS = ("gemma2", "gemma3")
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


def llama_cpp_permute(w, heads):
    """llama.cpp's convert_hf_to_gguf permute: each head's rows from HF's half order to the interleaved order."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama_cpp_rope_factors(rope, head_dim):
    """llama.cpp's convert_hf_to_gguf for Llama 3's rope scaling: the factor dividing each frequency, as its loop
    computes it."""
    old, low, high = rope["original_max_position_embeddings"], rope["low_freq_factor"], rope["high_freq_factor"]
    factors = []
    for freq in 1.0 / rope["rope_theta"] ** (np.arange(0, head_dim, 2) / head_dim):
        wavelen = 2 * np.pi / freq
        if wavelen < old / high:
            factors.append(1)
        elif wavelen > old / low:
            factors.append(rope["factor"])
        else:
            smooth = (old / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / rope["factor"] + smooth))
    return np.array(factors, np.float32)


def gguf_name(hf_name: str, names=_NAMES) -> str:
    stem, kind = hf_name.rsplit(".", 1)
    for pattern, hf in names.items():
        for i in range(8):
            if hf.format(i=i) == stem:
                return f"{pattern.format(i=i)}.{kind}"
    raise KeyError(hf_name)


def byte_level_bpe():
    """A byte-level BPE of 300 ids trained on TEXT by `tokenizers`: {"tokens": by id, "merges": "a b" strings}."""
    trainer = tokenizers.ByteLevelBPETokenizer()
    trainer.train_from_iterator([TEXT], vocab_size=300, special_tokens=SPECIALS)
    vocab, merges = trainer.get_vocab(), json.loads(trainer.to_str())["model"]["merges"]
    return {
        "tokens": sorted(vocab, key=vocab.get),
        "merges": [m if isinstance(m, str) else " ".join(m) for m in merges],
    }


SPM_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]  # Gemma's first ids


def sentencepiece_bpe():
    """A SentencePiece-style BPE trained on TEXT by `tokenizers` as Gemma's tokenizer reads text (spaces as U+2581,
    no prefix space, byte fallback): {"tokens": by id (Gemma's specials, the 256 byte tokens, the characters, then
    the merges' results in order), "merges"}."""
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>", byte_fallback=True))
    bpe.normalizer = tokenizers.normalizers.Replace(" ", "\u2581")
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace(prepend_scheme="never")
    bpe.train_from_iterator([TEXT], tokenizers.trainers.BpeTrainer(vocab_size=120, special_tokens=SPM_SPECIALS))
    vocab, merges = bpe.get_vocab(), json.loads(bpe.to_str())["model"]["merges"]
    learned = [t for t in sorted(vocab, key=vocab.get) if t not in SPM_SPECIALS]
    return {
        "tokens": SPM_SPECIALS + [f"<0x{b:02X}>" for b in range(256)] + learned,
        "merges": [m if isinstance(m, str) else " ".join(m) for m in merges],
    }


def spm_token_type(token: str) -> int:
    """llama.cpp's token types: 3 control, 2 unknown, 6 byte, 1 normal."""
    return (
        3
        if token in ("<pad>", "<eos>", "<bos>", "<mask>")
        else 2
        if token == "<unk>"
        else 6
        if token[:3] == "<0x"
        else 1
    )


def metadata(c, arch: str, attention_scale=None) -> dict:
    """llama.cpp's hyperparameter keys of a transformers config, by GGUFWriter's add_* name (None: not written): the
    Llama family's (its rope dimension and vocabulary size) or Gemma's (its soft caps, Gemma 3's global RoPE base and
    linear scaling; `attention_scale`: {arch}.attention.scale, which newer files may carry)."""
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    rope = c.rope_parameters.get("full_attention", c.rope_parameters)
    keys = {
        "context_length": c.max_position_embeddings,
        "embedding_length": c.hidden_size,
        "feed_forward_length": c.intermediate_size,
        "block_count": c.num_hidden_layers,
        "head_count": c.num_attention_heads,
        "head_count_kv": c.num_key_value_heads,
        "layer_norm_rms_eps": c.rms_norm_eps,
        "key_length": head_dim,
        "value_length": head_dim,
        "sliding_window": getattr(c, "sliding_window", None) or None,
        "rope_freq_base": rope["rope_theta"],
    }
    if arch not in GEMMA_ARCHS:
        return keys | {"vocab_size": c.vocab_size, "rope_dimension_count": head_dim}
    linear = rope.get("rope_type") == "linear"
    return keys | {
        "rope_scaling_type": gguf.RopeScalingType.LINEAR if linear else None,
        "rope_scaling_factor": rope["factor"] if linear else None,
        "attn_logit_softcapping": c.attn_logit_softcapping if arch == "gemma2" else None,
        "final_logit_softcapping": c.final_logit_softcapping or None,
        "attention_scale": attention_scale,
    }


def add_vocabulary(w, vocab: dict, arch: str) -> None:
    """The Llama family's byte-level BPE (byte_level_bpe: tokens and merges, ChatML specials, a chat template) or
    Gemma's SentencePiece vocabulary (sentencepiece_bpe: tokens, scores, token types, no merges)."""
    tokens = vocab["tokens"]
    w.add_token_list(tokens)
    if arch in GEMMA_ARCHS:
        w.add_tokenizer_model("llama")
        w.add_token_scores([-float(i) for i in range(len(tokens))])
        w.add_token_types([spm_token_type(t) for t in tokens])
        w.add_add_space_prefix(False)
        for name in ("bos", "eos", "pad", "unk"):
            getattr(w, f"add_{name}_token_id")(tokens.index(f"<{name}>"))
        return
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_merges(vocab["merges"])
    w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    w.add_bos_token_id(tokens.index("<|im_start|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_chat_template(TEMPLATE)


def write_gguf(path, model, vocab, arch: str, qtype, attention_scale=None):
    """A .gguf file of a transformers model and its vocabulary laid out as llama.cpp's converter writes it: 2-D
    weights in `qtype`, norms F32; the llama architecture's Q/K rows interleaved and Llama 3's rope scaling as the
    rope_freqs tensor; Gemma's norm gains + 1 and Gemma 2's lm_head dropped (Q/K rows as they are: NeoX RoPE)."""
    c, gemma = model.config, arch in GEMMA_ARCHS
    w = gguf.GGUFWriter(str(path), arch)
    keys = metadata(c, arch, attention_scale)
    for name, value in keys.items():
        if value is not None:
            getattr(w, f"add_{name}")(value)
    if c.rope_parameters.get("rope_type") == "llama3":
        w.add_tensor("rope_freqs.weight", llama_cpp_rope_factors(c.rope_parameters, keys["key_length"]))
    add_vocabulary(w, vocab, arch)
    heads = {"q_proj": c.num_attention_heads, "k_proj": c.num_key_value_heads}
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and (c.tie_word_embeddings or arch == "gemma2"):
            continue
        a = t.numpy().astype(np.float32)
        if gemma and name.endswith("norm.weight"):
            a = a + 1.0
        projection = name.split(".")[-2]
        if arch == "llama" and projection in heads:
            a = llama_cpp_permute(a, heads[projection])
        target = gguf_name(name, _NAMES | GEMMA_NAMES if gemma else _NAMES)
        if a.ndim == 2 and qtype != gguf.GGMLQuantizationType.F32:
            w.add_tensor(target, gguf.quants.quantize(a, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(target, a)
    finish(w)
    return path


def finish(w) -> None:
    """GGUFWriter's header, metadata and tensors to the file, then closed."""
    for write in (w.write_header_to_file, w.write_kv_data_to_file, w.write_tensors_to_file, w.close):
        write()
