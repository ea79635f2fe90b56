"""GGUF files of tiny transformers models written with gguf.GGUFWriter as llama.cpp's converter (convert_hf_to_gguf)
writes them: its metadata, its tensor names, the llama architecture's Q/K rows interleaved, Llama 3's rope scaling as
the rope_freqs tensor; with a byte-level BPE whose vocabulary and merges go into the metadata. Gemma 2 / 3 files
(write_gemma_gguf) as its Gemma2Model / Gemma3Model write them: norm gains stored as 1 + w, a SentencePiece
vocabulary (tokens, scores, token types, no merges). What tests/test_gguf.py, tests/test_gguf_gemma.py and
benchmarks/convert_equality.py share; it imports gguf and tokenizers, so a test importorskips them first."""

from __future__ import annotations

import json

import gguf
import numpy as np
import tokenizers

from txjax.convert.gguf import _NAMES
from txjax.convert.gguf_gemma import NAMES as GEMMA_NAMES

TEXT = "the quick brown fox jumps over the lazy dog; ROMEO: what light through yonder window breaks?\n" * 20
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
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


def write_gguf(path, model, bpe, arch: str, qtype):
    """A .gguf file of a transformers model and a byte-level BPE ({"tokens", "merges"}), laid out as llama.cpp's
    converter writes it: 2-D weights in `qtype`, norms F32, the llama architecture's Q/K rows interleaved."""
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    w = gguf.GGUFWriter(str(path), arch)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    if getattr(c, "sliding_window", None):
        w.add_sliding_window(c.sliding_window)
    rope = c.rope_parameters
    if rope.get("rope_type") == "llama3":
        w.add_tensor("rope_freqs.weight", llama_cpp_rope_factors(rope, head_dim))
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


def write_gemma_gguf(path, model, spm, qtype, attention_scale=None):
    """A .gguf file of a transformers Gemma2/Gemma3ForCausalLM and a SentencePiece vocabulary as llama.cpp's
    converter writes it: every norm gain + 1, Q/K rows as they are (NeoX RoPE), Gemma 2's lm_head dropped, Gemma 3's
    global RoPE (base, linear scaling) only; `attention_scale`: {arch}.attention.scale, which newer files may carry."""
    c = model.config
    arch = {"gemma2": "gemma2", "gemma3_text": "gemma3"}[c.model_type]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_sliding_window(c.sliding_window)
    rope = c.rope_parameters.get("full_attention", c.rope_parameters)
    w.add_rope_freq_base(rope["rope_theta"])
    if rope.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["factor"])
    if arch == "gemma2":
        w.add_attn_logit_softcapping(c.attn_logit_softcapping)
    if c.final_logit_softcapping:
        w.add_final_logit_softcapping(c.final_logit_softcapping)
    if attention_scale is not None:
        w.add_attention_scale(attention_scale)
    tokens = spm["tokens"]
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([-float(i) for i in range(len(tokens))])
    w.add_token_types([spm_token_type(t) for t in tokens])
    w.add_add_space_prefix(False)
    for name in ("bos", "eos", "pad", "unk"):
        getattr(w, f"add_{name}_token_id")(tokens.index(f"<{name}>"))
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and (arch == "gemma2" or c.tie_word_embeddings):
            continue
        a = t.numpy().astype(np.float32) + (1.0 if name.endswith("norm.weight") else 0.0)
        target = gguf_name(name, _NAMES | GEMMA_NAMES)
        if a.ndim == 2 and qtype != gguf.GGMLQuantizationType.F32:
            w.add_tensor(target, gguf.quants.quantize(a, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(target, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
