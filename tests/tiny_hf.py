"""Tiny random Hugging Face models built by transformers (nothing downloaded), saved as the folders `run.py import`
reads: the decoder LMs (the Llama family: Llama, Llama 3's rope scaling, Mistral with and without its window, Qwen2,
Qwen3, SmolLM3 with a NoPE layer; Gemma 2 and 3; the mixtures of experts Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE and
GPT-OSS; DeepSeek-V3, dense and with an MoE layer; Llama 4's text model; Qwen3-Next) and the encoder-decoders
(Marian, BART, T5, T5 v1.1). What the converter tests and benchmarks/convert_equality.py (which measures every
converter on these models) share; it imports torch, transformers and tokenizers, so a test importorskips
them first."""

from __future__ import annotations

import io
import json

import numpy as np
import sentencepiece as spm
import tokenizers
import torch
import transformers

from txjax.model.models import DecoderLM


def randomized(model, keep=lambda name: False):
    """The model with norm gains ~ N(1, 0.2^2) and every other parameter ~ N(0, 0.2^2) (but those `keep` names), so
    that logits are of order 10; seeded."""
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not keep(name):
                p.normal_(1.0 if "norm" in name and name.endswith("weight") else 0.0, 0.2)
    return model.eval()


def torch_logits(model, tokens_BxL):
    """transformers' logits of a decoder LM, as NumPy."""
    with torch.no_grad():
        return model(torch.as_tensor(np.asarray(tokens_BxL))).logits.numpy()


def txjax_logits(cfg, params, tokens_BxL):
    """txjax's DecoderLM(cfg) logits at `params`, as NumPy."""
    return np.asarray(DecoderLM(cfg).apply({"params": params}, np.asarray(tokens_BxL)))


def assert_logits_match(model, cfg, params, tokens_BxL) -> None:
    """txjax's logits within 1e-4 of transformers' (which are not trivially small: some above 3)."""
    want = torch_logits(model, tokens_BxL)
    assert np.abs(want).max() > 3.0
    np.testing.assert_allclose(txjax_logits(cfg, params, tokens_BxL), want, atol=1e-4, rtol=0)


def hf_greedy(model, prompt: list[int], new_tokens: int) -> list[int]:
    """transformers.generate's greedy `new_tokens` after one prompt. The tests compare txjax's greedy ids with these
    for equality although the two backends' logits differ in the last digits: randomized weights give logits of order
    10, so no step's two best lie within that difference."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False)
    return out[0, len(prompt) :].tolist()


# ---- decoder LMs ----------------------------------------------------------------------------------------------------

# 300 ids: tiny_gguf.byte_level_bpe's, so that a .gguf file of the same model holds its vocabulary
LM_VOCAB, LM_CTX = 300, 64
SHAPE = dict(num_hidden_layers=2, num_attention_heads=4, bos_token_id=None, eos_token_id=None, pad_token_id=None)
COMMON = SHAPE | dict(
    vocab_size=LM_VOCAB, hidden_size=64, intermediate_size=96, max_position_embeddings=LM_CTX, rms_norm_eps=1e-5
)
# Llama 3's rope scaling with two of head_dim 16's eight frequencies between its bands (what a .gguf's rope_freqs
# needs to give its bands back: tests/test_gguf.py)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 5e4,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 16.0,
    "original_max_position_embeddings": 32,
}
LLAMAS = {  # GQA in all; untied heads, an odd rope base, head_dim apart from d/h, Qwen2's q/k/v biases
    "llama": ("LlamaConfig", dict(num_key_value_heads=2, rope_theta=5e4, tie_word_embeddings=False)),
    "mistral": (
        "MistralConfig",
        dict(num_key_value_heads=1, head_dim=24, sliding_window=None, tie_word_embeddings=True),
    ),
    "qwen2": ("Qwen2Config", dict(num_key_value_heads=2, tie_word_embeddings=False)),
    "llama3": ("LlamaConfig", dict(num_key_value_heads=2, tie_word_embeddings=False, rope_parameters=LLAMA3_ROPE)),
    "mistral_window": (
        "MistralConfig",
        dict(num_key_value_heads=1, head_dim=24, sliding_window=8, tie_word_embeddings=True),
    ),
    "qwen3_yarn": (
        "Qwen3Config",
        dict(
            num_key_value_heads=2,
            head_dim=32,
            tie_word_embeddings=False,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 1e4,
                "factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        ),
    ),
    "qwen3": ("Qwen3Config", dict(num_key_value_heads=2, head_dim=16, rope_theta=5e4, tie_word_embeddings=True)),
    # SmolLM3: a NoPE layer (no_rope_layers: 1 RoPE, 0 none) after a RoPE one
    "smollm3": (
        "SmolLM3Config",
        dict(num_key_value_heads=2, rope_theta=5e4, tie_word_embeddings=True, no_rope_layers=[1, 0]),
    ),
}
SMALL = SHAPE | dict(hidden_size=32, num_key_value_heads=2)  # Gemma's and the MoE models': d_model 32, 2 KV heads
# Gemma: 4 heads of 16; 258 ids (a byte-level BPE's 256 bytes, <s> and </s>)
GEMMA = SMALL | dict(vocab_size=258, intermediate_size=64, head_dim=16, max_position_embeddings=64, rms_norm_eps=1e-6)
GEMMAS = {
    # Gemma 2: alternating local/global layers, both soft caps binding, a score scale apart from 1/sqrt(d_k)
    "gemma2": (
        "Gemma2Config",
        dict(sliding_window=6, query_pre_attn_scalar=24, attn_logit_softcapping=2.0, final_logit_softcapping=8.0),
    ),
    # Gemma 3: its 5:1 pattern over 6 layers, q/k norms, the local base 1e4 and a linear x8 global RoPE, untied head
    "gemma3_text": (
        "Gemma3TextConfig",
        dict(
            num_hidden_layers=6,
            sliding_window=8,
            query_pre_attn_scalar=16,
            tie_word_embeddings=False,
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            },
        ),
    ),
}
MOE = SMALL | dict(vocab_size=96, max_position_embeddings=48, num_experts_per_tok=2, tie_word_embeddings=False)
MOES = {  # 4 experts, top-2 in each; the fields each family adds
    "mixtral": ("MixtralConfig", dict(num_local_experts=4, intermediate_size=24)),
    "qwen2_moe": (
        "Qwen2MoeConfig",
        dict(
            num_experts=4,
            intermediate_size=40,  # layer 0's dense MLP (decoder_sparse_step=2: layer 1 alone is MoE)
            moe_intermediate_size=16,
            shared_expert_intermediate_size=32,  # two experts' width
            decoder_sparse_step=2,
        ),
    ),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        dict(num_experts=4, intermediate_size=40, moe_intermediate_size=16, head_dim=16, norm_topk_prob=True),
    ),
    "olmoe": ("OlmoeConfig", dict(num_experts=4, intermediate_size=24)),
    # GPT-OSS: sinks, biases, a 4-token window in layer 0 (global layer 1), its default YaRN (truncate false)
    "gpt_oss": ("GptOssConfig", dict(num_local_experts=4, intermediate_size=16, head_dim=8, sliding_window=4)),
}
# Llama 4 text: RoPE / NoPE layers alternating, RoPE chunked by 8, NoPE's temperature binding, q/k L2 norm, top-1 MoE
LLAMA4 = MOE | dict(num_hidden_layers=4, head_dim=8, intermediate_size=16, intermediate_size_mlp=48)
LLAMA4 |= dict(num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=2, no_rope_layer_interval=2)
LLAMA4 |= dict(attention_chunk_size=8, floor_scale=4, attn_scale=0.5, rope_parameters={"rope_theta": 5e4})
# DeepSeek-V3: multi-head latent attention (a query latent), YaRN with mscale_all_dim; dense, or an MoE second layer
DEEPSEEK = SHAPE | dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_key_value_heads=4, q_lora_rank=8)
DEEPSEEK |= dict(kv_lora_rank=12, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5, max_position_embeddings=48)
DEEPSEEK |= dict(rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, mscale_all_dim=0.8))
DEEPSEEK["rope_parameters"] |= dict(original_max_position_embeddings=12, mscale=1.0)
DEEPSEEKS = {
    "deepseek_v3": ("DeepseekV3Config", dict(first_k_dense_replace=2)),
    "deepseek_v3_moe": (
        "DeepseekV3Config",
        dict(first_k_dense_replace=1, n_routed_experts=8, n_group=4, topk_group=2, num_experts_per_tok=2,
             n_shared_experts=1, moe_intermediate_size=16, routed_scaling_factor=2.5, norm_topk_prob=True),
    ),
}  # fmt: skip
# Qwen3-Next: Gated DeltaNet and gated full attention alternating over 4 layers (2 key heads of 8 for 4 value heads of
# 6), partial RoPE (a quarter of head_dim 16), MoE layers every 2nd with a shared expert
QWEN3_NEXT = MOE | dict(num_hidden_layers=4, layer_types=["linear_attention", "full_attention"] * 2, head_dim=16)
QWEN3_NEXT |= dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=6)
QWEN3_NEXT |= dict(num_experts=4, intermediate_size=40, moe_intermediate_size=16, shared_expert_intermediate_size=16)
QWEN3_NEXT |= dict(decoder_sparse_step=2)
DECODERS = {  # kind -> (config class, its fields)
    kind: (config_class, base | fields)
    for base, kinds in [(COMMON, LLAMAS), (GEMMA, GEMMAS), (MOE, MOES), (DEEPSEEK, DEEPSEEKS)]
    for kind, (config_class, fields) in kinds.items()
} | {"llama4_text": ("Llama4TextConfig", LLAMA4), "qwen3_next": ("Qwen3NextConfig", QWEN3_NEXT)}


def decoder_config(kind: str, **changes):
    """The transformers config of DECODERS[kind], with `changes`."""
    config_class, fields = DECODERS[kind]
    return getattr(transformers, config_class)(**(fields | changes))


def random_decoder(kind: str, **changes):
    """A randomized transformers causal LM of DECODERS[kind] (randomized's; Qwen3-Next's (1 + w) norms' w ~ N(0,
    0.2^2)); Gemma's (1 + w) norms' w ~ N(0, 0.2^2) and all else N(0, 0.3^2), seeded before transformers' own init."""
    config = decoder_config(kind, **changes)
    if kind == "qwen3_next":  # its (1 + w) RMSNorms' w ~ N(0, 0.2^2) (the gated norm's gain, w, N(1, 0.2^2))
        model = randomized(transformers.AutoModelForCausalLM.from_config(config))
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.sub_(1.0 if name.endswith(("layernorm.weight", "model.norm.weight", "_norm.weight")) else 0.0)
        return model
    if kind not in GEMMAS:
        return randomized(transformers.AutoModelForCausalLM.from_config(config))
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0.0, 0.2 if "norm" in name else 0.3)
    return model


def save_decoder(kind: str, folder, **changes):
    """random_decoder(kind) saved by transformers into `folder` with a word-level tokenizer of 3 ids (<s>, </s>,
    <unk>: `run.py import` reads a tokenizer; the comparisons feed random ids); returns the model."""
    model = random_decoder(kind, **changes)
    words = tokenizers.Tokenizer(tokenizers.models.WordLevel({"<s>": 0, "</s>": 1, "<unk>": 2}, unk_token="<unk>"))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=words, bos_token="<s>", eos_token="</s>")
    model.save_pretrained(folder)
    fast.save_pretrained(folder)
    return model


def byte_level_tokenizer(text: str, vocab_size: int, chat_template: str | None = None):
    """A byte-level BPE fast tokenizer trained on `text` that adds BOS <s> first as Llama's does (EOS </s>)."""
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator([text], vocab_size=vocab_size, special_tokens=["<s>", "</s>"])
    bpe.post_processor = tokenizers.processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<s>", eos_token="</s>")
    fast.chat_template = chat_template
    return fast


def save_tiny_decoder(folder, text: str, vocab_size: int, max_positions: int, kind="llama", chat_template=None):
    """A random 2-layer model of DECODERS[kind] (d_model 32, 4 heads; 2 KV heads but in MLA) saved by transformers
    into `folder` with byte_level_tokenizer(text) (and `chat_template`); returns the model."""
    fast = byte_level_tokenizer(text, vocab_size, chat_template)
    sizes = dict(hidden_size=32, intermediate_size=64)
    sizes |= dict(num_key_value_heads=2, head_dim=8) if kind not in DEEPSEEKS else {}  # MLA: its heads' own sizes
    config = decoder_config(kind, vocab_size=fast.vocab_size, max_position_embeddings=max_positions, **sizes)
    config.bos_token_id, config.eos_token_id = 0, 1
    model = randomized(transformers.AutoModelForCausalLM.from_config(config))
    model.save_pretrained(folder)
    fast.save_pretrained(folder)
    return model


# ---- encoder-decoders: Marian, BART, T5 -----------------------------------------------------------------------------

PAIRS = [
    ("the cat sat on the mat", "el gato se sento en la alfombra"),
    ("the dog ran in the park", "el perro corrio en el parque"),
    ("a bird sings in the tree", "un pajaro canta en el arbol"),
    ("the sun is hot today", "el sol esta caliente hoy"),
    ("we read a book at night", "leemos un libro por la noche"),
    ("my friend lives near the sea", "mi amigo vive cerca del mar"),
] * 4
S2S_VOCAB, S2S_CTX = 120, 64
BART_SIZES = dict(
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=2,
    decoder_attention_heads=2,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_position_embeddings=S2S_CTX,
    scale_embedding=True,
)
# T5: d_kv apart from d_model / heads, 8 buckets up to distance 20, so that 40 tokens reach the logarithmic ones
T5_SIZES = dict(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=2, relative_attention_num_buckets=8)
T5_SIZES |= dict(relative_attention_max_distance=20, n_positions=S2S_CTX)
# per model: its specials in id order, (EOS, pad, decoder start), the config class and its fields
SEQ2SEQ = {
    "marian": (["</s>", "<unk>", "<pad>"], (0, 2, 2), "MarianConfig", BART_SIZES | dict(activation_function="swish")),
    "bart": (["<s>", "<pad>", "</s>", "<unk>"], (2, 1, 2), "BartConfig", BART_SIZES | dict(activation_function="gelu")),
    "t5": (["<pad>", "</s>", "<unk>"], (1, 0, 0), "T5Config", T5_SIZES | dict(feed_forward_proj="relu")),
    "t5v1_1": (["<pad>", "</s>", "<unk>"], (1, 0, 0), "T5Config", T5_SIZES | dict(feed_forward_proj="gated-gelu")),
}
# what each one's tokenizer.json adds around a source, as the real ones' do (Marian's: none, a stand-in's)
T5_PROCESSOR = lambda: tokenizers.processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
POST_PROCESSORS = {
    "marian": lambda: None,
    "bart": lambda: tokenizers.processors.RobertaProcessing(("</s>", 2), ("<s>", 0)),
    "t5": T5_PROCESSOR,
    "t5v1_1": T5_PROCESSOR,
}


def seq2seq_config(kind, **changes):
    """The transformers config of SEQ2SEQ[kind], with `changes`."""
    _, (eos, pad, start), config_class, fields = SEQ2SEQ[kind]
    fields = fields | dict(
        vocab_size=S2S_VOCAB,
        eos_token_id=eos,
        pad_token_id=pad,
        decoder_start_token_id=start,  # Marian's and T5's decoders start from pad, BART's from EOS
        forced_eos_token_id=None,  # generate would force EOS as the 40th token; txjax's greedy search does not
    )
    if kind == "t5v1_1":
        fields["tie_word_embeddings"] = False  # v1.1: no d_model^-0.5 on the decoder output (transformers 5 ties)
    return getattr(transformers, config_class)(**(fields | changes))


def save_tiny_seq2seq(kind, folder, **changes):
    """A random 2+2-layer model of `kind` with a random final_logits_bias (T5: relative bias and tokens of std 1) and
    EOS pushed down (T5: its token row zero) so that greedy search runs its 40 tokens, saved by transformers with a
    BPE fast tokenizer trained on both sides of PAIRS (BART's and T5's post-processors: <s> ... </s>, ... </s>);
    returns it."""
    specials = SEQ2SEQ[kind][0]
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=S2S_VOCAB, special_tokens=specials)
    bpe.train_from_iterator([s for pair in PAIRS for s in pair], trainer)
    bpe.post_processor = POST_PROCESSORS[kind]()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, unk_token="<unk>")
    config = seq2seq_config(kind, **changes)
    model = transformers.AutoModelForSeq2SeqLM.from_config(config)
    # Marian's sinusoid table is a parameter too: kept
    randomized(model, keep=lambda name: kind == "marian" and "embed_positions" in name)
    with torch.no_grad():
        if hasattr(model, "final_logits_bias"):
            model.final_logits_bias.normal_(0.0, 1.0)
            model.final_logits_bias[0, config.eos_token_id] = -30.0
        else:
            for name, p in model.named_parameters():
                if "relative_attention_bias" in name:
                    p.normal_(0.0, 1.0)
            model.get_input_embeddings().weight.normal_(0.0, 1.0)  # T5's init: the head reads it at d_model^-0.5
            model.get_input_embeddings().weight[config.eos_token_id] = 0.0
    model.save_pretrained(folder)
    fast.save_pretrained(folder)
    return model


def sources(tokenizer):
    """(ids, src, mask): two sources of different lengths, each ending with EOS as MarianTokenizer's do, right-padded
    into src with its 0/1 mask."""
    eos = tokenizer.eos_id
    ids = [tokenizer.encode(PAIRS[0][0]) + [eos], tokenizer.encode(PAIRS[3][0] + " " + PAIRS[4][0]) + [eos]]
    src = np.full((2, max(map(len, ids))), tokenizer.pad_id, np.int32)
    mask = np.zeros_like(src)
    for row, row_mask, s in zip(src, mask, ids):
        row[: len(s)], row_mask[: len(s)] = s, 1
    return ids, src, mask


def seq2seq_logits(hf, model, params, tokenizer):
    """(transformers' logits, txjax's) of sources(tokenizer) and a 7-token target prefix from the decoder start."""
    _, src, mask = sources(tokenizer)
    tgt = np.array([[tokenizer.bos_id, *tokenizer.encode(PAIRS[0][1])[:6]]] * 2, np.int32)
    with torch.no_grad():
        want = hf(
            input_ids=torch.tensor(src, dtype=torch.long),
            attention_mask=torch.tensor(mask),
            decoder_input_ids=torch.tensor(tgt, dtype=torch.long),
        ).logits.numpy()
    return want, np.asarray(model.apply({"params": params}, src, tgt, src_segment_ids=mask))


def save_marian_tokenizer(folder):
    """MarianTokenizer's own files in `folder` (source.spm = target.spm: a SentencePiece word model of both sides of
    PAIRS, </s> 0, <unk> 1, <pad> 2 as SEQ2SEQ["marian"]; vocab.json its pieces' ids) and, as its tokenizer.json, a
    `tokenizers` stand-in of the same vocabulary without a post-processor (Marian has no fast tokenizer: a user
    writes one); returns the MarianTokenizer."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([s for pair in PAIRS for s in pair]),
        model_writer=model,
        model_type="word",
        vocab_size=S2S_VOCAB,
        hard_vocab_limit=False,
        eos_id=0,
        unk_id=1,
        pad_id=2,
        bos_id=-1,
        minloglevel=2,
    )
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    for name in ("source.spm", "target.spm"):
        (folder / name).write_bytes(model.getvalue())
    (folder / "vocab.json").write_text(json.dumps(vocab))
    words = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    words.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace()
    words.decoder = tokenizers.decoders.Metaspace()
    words.add_special_tokens(["</s>", "<unk>", "<pad>"])
    words.save(str(folder / "tokenizer.json"))
    return marian_tokenizer(folder)


def marian_tokenizer(folder):
    """transformers' MarianTokenizer of the files save_marian_tokenizer wrote into `folder`."""
    return transformers.MarianTokenizer(*(str(folder / name) for name in ("source.spm", "target.spm", "vocab.json")))
