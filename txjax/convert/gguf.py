"""GGUF files (llama.cpp's format) -> DecoderLM parameters and the model's own tokenizer.

Read with the `gguf` package: `GGUFReader` maps the file (each tensor's header is checked against the file and the
model the metadata describes against memory before any is read), `gguf.quants.dequantize` turns each tensor's blocks
(F32, F16, BF16, Q8_0, Q4_0, Q4_1, the K-quants, ... whatever that package dequantizes) into float32. GGUF lists
shapes fastest axis first, so a [in, out] tensor is NumPy's [out, in]: a Hugging Face Linear weight. Tensors are
renamed to Hugging Face's names (`_NAMES`) and handed to txjax.convert.llama, with one difference: for the `llama`
architecture llama.cpp's converter has already permuted each head's Q/K rows into the adjacent-pair order of
txjax's apply_rope (its `permute`, which transformers undoes on loading), so nothing is permuted here; `qwen2`
and `qwen3` files keep the half layout (llama.cpp rotates them NeoX-style) and are permuted like a Hugging Face
folder. What llama.cpp stores beyond the Llama 2 shape: Qwen3's per-head q/k norms (`attn_q_norm`, `attn_k_norm`),
a sliding window (`{arch}.attention.sliding_window`: Mistral's, every layer local), linear rope scaling
(`{arch}.rope.scaling.type` and `.factor`), and Llama 3's rope scaling, which llama.cpp keeps only as the factor
dividing each frequency (the `rope_freqs` tensor): its factor, low/high frequency factors and original context are
recovered from those factors (`llama3_from_factors`) and must give them back. Gemma 2 and Gemma 3 files (`gemma2`,
`gemma3`) are read by txjax.convert.gguf_gemma (their norms, soft caps, local layers, score scale) into
txjax.convert.gemma.

The tokenizer comes from the metadata: for byte-level BPE (`tokenizer.ggml.model=gpt2`) `tokenizer.ggml.tokens`
(already in the byte-level alphabet) and `merges` make a `tokenizers` BPE; `tokenizer.ggml.pre` names the
pre-tokenizer (llama.cpp's regexes, `_PRE_TOKENIZERS`); control tokens become special tokens, user-defined ones
added tokens. A SentencePiece vocabulary (`llama`: tokens, scores, token types, as Gemma's) is rebuilt by
transformers' GGUF tokenizer builders (transformers.integrations.gguf). BOS/EOS/pad ids, add_bos_token and
add_eos_token (what goes around a text, as transformers' tokenizer of the file adds it) and
`tokenizer.chat_template` are kept. Anything else is a one-line ValueError naming the key.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import numpy as np

from txjax.convert import gguf_gemma
from txjax.convert.hf_folder import Stored, check_fits, check_headers
from txjax.convert.llama import config_from_hf, params_from_hf
from txjax.data.hf_tokenizer import HFTokenizer, chat_template
from txjax.extras import require
from txjax.model.config import ModelConfig

# GGUF general.architecture -> Hugging Face model_type
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
_PAIRS_LAYOUT = {"llama": True, "qwen2": False, "qwen3": False}  # Q/K rows already in txjax's (2i, 2i+1) order
ROPE_FREQS = "rope_freqs.weight"  # Llama 3's rope scaling as llama.cpp stores it: one factor per frequency
_NAMES = {  # GGUF tensor name -> Hugging Face name ({i}: the block)
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
    "blk.{i}.attn_norm": "model.layers.{i}.input_layernorm",
    "blk.{i}.ffn_norm": "model.layers.{i}.post_attention_layernorm",
    "blk.{i}.attn_q": "model.layers.{i}.self_attn.q_proj",
    "blk.{i}.attn_k": "model.layers.{i}.self_attn.k_proj",
    "blk.{i}.attn_v": "model.layers.{i}.self_attn.v_proj",
    "blk.{i}.attn_output": "model.layers.{i}.self_attn.o_proj",
    "blk.{i}.attn_q_norm": "model.layers.{i}.self_attn.q_norm",
    "blk.{i}.attn_k_norm": "model.layers.{i}.self_attn.k_norm",
    "blk.{i}.ffn_gate": "model.layers.{i}.mlp.gate_proj",
    "blk.{i}.ffn_up": "model.layers.{i}.mlp.up_proj",
    "blk.{i}.ffn_down": "model.layers.{i}.mlp.down_proj",
}
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# tokenizer.ggml.pre -> the regexes llama.cpp splits with, in order (llama-vocab.cpp), before the byte-level BPE
_PRE_TOKENIZERS = {
    "default": [_GPT2_SPLIT],
    "gpt-2": [_GPT2_SPLIT],
    "smollm": [r"\p{N}", _GPT2_SPLIT],  # single digits, then GPT-2's regex (SmolLM's Digits + ByteLevel)
    "llama-bpe": [_LLAMA3_SPLIT],
    "llama3": [_LLAMA3_SPLIT],
    "qwen2": [_QWEN2_SPLIT],
}
_CONTROL, _USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values


def _hf_name(name: str, arch: str | None = None) -> str | None:
    """blk.3.attn_q.weight -> model.layers.3.self_attn.q_proj.weight (None: not a tensor of `arch`'s model; Gemma's
    norms have their own names, gguf_gemma.NAMES)."""
    m = re.fullmatch(r"(?:blk\.(\d+)\.)?(\w+)\.(weight|bias)", name)
    if m is None:
        return None
    block, base, kind = m.groups()
    names = _NAMES | gguf_gemma.NAMES if arch in gguf_gemma.ARCHITECTURES else _NAMES
    hf = names.get(base if block is None else f"blk.{{i}}.{base}")
    return None if hf is None else f"{hf.format(i=block)}.{kind}"


class GGUFFile:
    """The metadata and tensors of one .gguf file; a missing or truncated file is a one-line ValueError."""

    def __init__(self, path):
        gguf = require("gguf", "reading a .gguf file")

        self.path = Path(path).expanduser()
        if not self.path.is_file():
            raise ValueError(f"{self.path}: no such GGUF file")
        try:
            self.reader = gguf.GGUFReader(self.path)
        except Exception as e:  # the reader raises ValueError, IndexError, struct.error on a damaged file
            raise ValueError(
                f"{self.path}: not a readable GGUF file ({type(e).__name__}: {e}); is it complete?"
            ) from None

    def get(self, key: str, default=None):
        field = self.reader.fields.get(key)
        return default if field is None else field.contents()

    def require(self, key: str):
        value = self.get(key)
        if value is None:
            raise ValueError(f"{self.path}: metadata key {key!r} is missing")
        return value

    def tensors(self) -> dict[str, Stored]:
        """Every tensor by its header, in its NumPy shape (reversed GGUF shape), renamed to Hugging Face names, each
        dequantized when it is read (Tensors.get); a header whose shape, type and bytes disagree, or point past the
        end of the file, is a ValueError naming the tensor, before any is read."""
        gguf = require("gguf", "reading a .gguf file")

        out, size, arch = {}, self.path.stat().st_size, self.get("general.architecture")
        for t in self.reader.tensors:
            hf_name = t.name if t.name == ROPE_FREQS else _hf_name(t.name, arch)
            if hf_name is None:
                raise ValueError(f"{self.path}: tensor {t.name!r} has no place in a {arch} model")
            block, block_bytes = gguf.GGML_QUANT_SIZES.get(t.tensor_type, (1, None))  # None: dequantize says
            n_elements = int(np.prod([int(n) for n in t.shape], dtype=object))
            claimed = int(t.n_bytes) if block_bytes is None else n_elements // block * block_bytes
            if n_elements % block or claimed != int(t.n_bytes) or int(t.data_offset) + claimed > size:
                raise ValueError(
                    f"{self.path}: the header of tensor {t.name} ({t.tensor_type.name}, shape {list(t.shape)}) claims "
                    f"{claimed:,} bytes at offset {int(t.data_offset):,}, the file has {size:,}: it is damaged"
                )
            shape = tuple(reversed([int(n) for n in t.shape]))
            out[hf_name] = Stored(shape, claimed, lambda t=t, shape=shape: self._dequantize(t).reshape(shape))
        return out

    def _dequantize(self, t) -> np.ndarray:
        gguf = require("gguf", "reading a .gguf file")
        try:
            return gguf.quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError:
            raise ValueError(f"{self.path}: {t.name} is {t.tensor_type.name}, which gguf cannot dequantize") from None


def config_from_gguf(f: GGUFFile, has_head: bool, rope_factors: np.ndarray | None = None) -> ModelConfig:
    """The {arch}.* metadata -> ModelConfig (through the Hugging Face config.json fields it names); rope_factors:
    the rope_freqs tensor (Llama 3's scaling), None without one."""
    arch = f.require("general.architecture")
    if arch in gguf_gemma.ARCHITECTURES:
        return gguf_gemma.config_from_gguf(f, has_head)
    if arch not in ARCHITECTURES:
        raise ValueError(
            f"{f.path}: general.architecture={arch!r} is not a model txjax reads "
            f"({', '.join([*ARCHITECTURES, *gguf_gemma.ARCHITECTURES])})"
        )
    heads = int(f.require(f"{arch}.attention.head_count"))
    d = int(f.require(f"{arch}.embedding_length"))
    head_dim = int(f.get(f"{arch}.attention.key_length", d // heads))
    rope_dim = int(f.get(f"{arch}.rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise ValueError(f"{f.path}: {arch}.rope.dimension_count={rope_dim} (partial RoPE) is not supported")
    hf = {
        "model_type": ARCHITECTURES[arch],
        "vocab_size": int(f.get(f"{arch}.vocab_size", len(f.require("tokenizer.ggml.tokens")))),
        "hidden_size": d,
        "intermediate_size": int(f.require(f"{arch}.feed_forward_length")),
        "num_hidden_layers": int(f.require(f"{arch}.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(f.get(f"{arch}.attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "max_position_embeddings": int(f.require(f"{arch}.context_length")),
        "rms_norm_eps": float(f.require(f"{arch}.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(f.get(f"{arch}.rope.freq_base", 10000.0)),
        "tie_word_embeddings": not has_head,
    }
    window = f.get(f"{arch}.attention.sliding_window")
    if window is not None:
        if arch != "llama":
            raise ValueError(f"{f.path}: {arch}.attention.sliding_window={window} is not supported (Mistral's is)")
        hf |= {"model_type": "mistral", "sliding_window": int(window)}  # Mistral: every layer local
    scaling = f.get(f"{arch}.rope.scaling.type", "none")
    if scaling == "linear":
        hf["rope_scaling"] = {"rope_type": "linear", "factor": float(f.require(f"{arch}.rope.scaling.factor"))}
    elif scaling != "none":
        raise ValueError(f"{f.path}: {arch}.rope.scaling.type={scaling!r} is not supported (none, linear)")
    if rope_factors is not None:
        hf["rope_scaling"] = llama3_from_factors(rope_factors, hf["rope_theta"], head_dim, f.path)
    return config_from_hf(hf, has_head)


def llama3_factors(inv_freq: np.ndarray, factor, low_freq_factor, high_freq_factor, original) -> np.ndarray:
    """Llama 3's rope scaling as the factor dividing each frequency (llama.cpp's convert_hf_to_gguf, `rope_freqs`):
    1 for wavelengths 2 pi / f under original / high_freq_factor, `factor` over original / low_freq_factor, between
    them 1 / ((1 - s) / factor + s) with s = (original / wavelength - low) / (high - low) (transformers' llama3)."""
    wavelength = 2 * np.pi / inv_freq
    smooth = (original / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
    medium = 1 / ((1 - smooth) / factor + smooth)
    return np.where(
        wavelength < original / high_freq_factor, 1.0, np.where(wavelength > original / low_freq_factor, factor, medium)
    )


def llama3_from_factors(factors: np.ndarray, base: float, head_dim: int, path) -> dict:
    """transformers' llama3 rope_scaling from llama.cpp's per-frequency factors: factor = the largest; the medium
    band's s = (1/f - 1/factor) / (1 - 1/factor) is linear in 1 / wavelength, s = original / (high - low) /
    wavelength - low / (high - low), fitted by least squares (only the ratios original/low, original/high count:
    low is chosen to make original an integer); the result must give the factors back, else a ValueError."""
    inv_freq = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    factors = np.asarray(factors, np.float64).reshape(-1)
    if factors.shape != inv_freq.shape:
        raise ValueError(
            f"{path}: {ROPE_FREQS} has {factors.size} factors, the heads rotate {inv_freq.size} frequencies"
        )
    factor = float(factors.max())
    medium = (factors > 1 + 1e-6) & (factors < factor * (1 - 1e-6))
    if factor > 1 and medium.sum() >= 2:
        s = (1 / factors[medium] - 1 / factor) / (1 - 1 / factor)
        slope, intercept = np.polyfit(inv_freq[medium] / (2 * np.pi), s, 1)  # s = slope / wavelength + intercept
        span = -1 / intercept  # high - low with low = 1
        original = max(1, round(slope * span))
        low = original / (slope * span)  # rescales (original, low, high) to an integer original: the same factors
        bands = {"factor": factor, "low_freq_factor": float(low), "high_freq_factor": float(low * (1 + span))}
        if np.allclose(llama3_factors(inv_freq, **bands, original=original), factors, rtol=1e-5, atol=0):
            return {"rope_type": "llama3", **bands, "original_max_position_embeddings": original}
    raise ValueError(
        f"{path}: {ROPE_FREQS} holds {factors.size} factors from {factors.min():.4g} to {factor:.4g} that are not "
        "Llama 3's rope scaling with two or more frequencies between its bands (txjax reads those)"
    )


def tokenizer_from_gguf(f: GGUFFile) -> HFTokenizer:
    """tokenizer.ggml.* -> a `tokenizers` pipeline (byte-level BPE here, SentencePiece through transformers) with
    the model's special tokens and template."""
    require(
        "tokenizers", "a .gguf file's tokenizer"
    )  # both pipelines are `tokenizers` ones: said before the file is read
    if (template := f.get("tokenizer.chat_template")) is not None:  # a broken one refused at import, not at --chat
        chat_template(template, f"{f.path} (tokenizer.chat_template)", "import a file whose template compiles")
    kind = f.require("tokenizer.ggml.model")
    if kind == "llama":
        pipeline = _sentencepiece(f)
    elif kind == "gpt2":
        pipeline = _byte_level_bpe(f)
    else:
        raise ValueError(
            f"{f.path}: tokenizer.ggml.model={kind!r} is not supported (txjax reads 'gpt2', byte-level BPE, and "
            "'llama', SentencePiece)"
        )
    ids = {name: f.get(f"tokenizer.ggml.{name}_token_id") for name in ("bos", "eos", "padding")}
    bos, eos, pad = (None if i is None else int(i) for i in ids.values())
    # llama.cpp adds BOS to a SentencePiece vocabulary whose file does not say otherwise, EOS only where it says so
    add_bos = bos is not None and bool(f.get("tokenizer.ggml.add_bos_token", kind == "llama"))
    add_eos = eos is not None and bool(f.get("tokenizer.ggml.add_eos_token", False))
    return HFTokenizer(
        pipeline,
        bos_id=bos,
        eos_id=eos,
        pad_id=pad,
        before=[bos] * add_bos,
        after=[eos] * add_eos,
        chat_template=template,
    )


def _sentencepiece(f: GGUFFile):
    """A SentencePiece vocabulary (tokens, scores, token types; merges rebuilt from them when the file has none)
    as transformers rebuilds it for `from_pretrained(gguf_file=...)`: its tokenizer class for the architecture
    (GemmaTokenizer for Gemma: byte fallback, no prefix space), control tokens special, user-defined ones added."""
    mapping = require("transformers.integrations.gguf", "a .gguf file's SentencePiece tokenizer")
    arch, tokenizer_dict, _ = mapping.get_gguf_tokenizer(str(f.path))
    pipeline = mapping.convert_gguf_tokenizer(arch, tokenizer_dict)[0]
    size = len(tokenizer_dict["tokens"])
    extra = [t.content for i, t in sorted(pipeline.get_added_tokens_decoder().items()) if i >= size]
    if extra:  # GemmaTokenizer adds its <unk>, <mask>, ... when the vocabulary lacks them: ids the model has not
        raise ValueError(f"{f.path}: the vocabulary of {size} tokens lacks {', '.join(extra)} (the {arch} tokenizer's)")
    return pipeline


def _byte_level_bpe(f: GGUFFile):
    """tokenizer.ggml.tokens (already in the byte-level alphabet) and merges -> a `tokenizers` BPE split by
    llama.cpp's regexes for tokenizer.ggml.pre."""
    tokenizers = require("tokenizers", "a .gguf file's tokenizer")
    from tokenizers import AddedToken, Regex, decoders, pre_tokenizers  # installed: require checked

    pre = f.get("tokenizer.ggml.pre", "default")
    if pre not in _PRE_TOKENIZERS:
        raise ValueError(f"{f.path}: tokenizer.ggml.pre={pre!r} is not supported ({', '.join(_PRE_TOKENIZERS)})")
    tokens = list(f.require("tokenizer.ggml.tokens"))
    merges = [tuple(m.split(" ", 1)) for m in f.require("tokenizer.ggml.merges")]
    pipeline = tokenizers.Tokenizer(tokenizers.models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in _PRE_TOKENIZERS[pre]]
    pipeline.pre_tokenizer = pre_tokenizers.Sequence(
        [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    pipeline.decoder = decoders.ByteLevel()
    types = list(f.get("tokenizer.ggml.token_type", [1] * len(tokens)))
    pipeline.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types) if k == _CONTROL]
    )
    pipeline.add_tokens(
        [AddedToken(t, special=False, normalized=False) for t, k in zip(tokens, types) if k == _USER_DEFINED]
    )
    return pipeline


def load_gguf(path) -> tuple[ModelConfig, dict, HFTokenizer]:
    """A .gguf file -> (ModelConfig, DecoderLM params as float32 NumPy, the model's tokenizer)."""
    f = GGUFFile(path)
    check_fits(config_from_gguf(f, has_head=True), f.path)  # before anything is dequantized
    tokenizer = tokenizer_from_gguf(f)
    tensors = f.tensors()
    rope_factors = tensors.pop(ROPE_FREQS).read() if ROPE_FREQS in tensors else None  # head_dim / 2 numbers
    cfg = config_from_gguf(f, has_head="lm_head.weight" in tensors, rope_factors=rope_factors)
    arch = f.get("general.architecture")
    if arch in gguf_gemma.ARCHITECTURES:
        convert = gguf_gemma.params_from_gguf
    else:
        convert = functools.partial(params_from_hf, pairs_layout=_PAIRS_LAYOUT[arch])
    try:
        check_headers(convert, tensors, cfg)  # every tensor's shape against the metadata's, before any is read
        params = convert(tensors, cfg)
    except ValueError as e:
        raise ValueError(f"{f.path}: {e}") from None
    return cfg, params, tokenizer
