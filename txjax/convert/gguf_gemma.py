"""Gemma 2 and Gemma 3 (text) .gguf files (llama.cpp's `gemma2`, `gemma3`) -> the Hugging Face config and tensors
txjax.convert.gemma reads.

What llama.cpp's converter (convert_hf_to_gguf.py, Gemma2Model / Gemma3Model) writes, and how it comes back:

    RMSNorm gains              stored as 1 + w (every `*norm.weight`)         w = stored - 1
    norm names                 attn_norm, post_attention_norm, ffn_norm (the FFN's input norm), post_ffw_norm
    Q/K rows                   Hugging Face's half layout (NeoX RoPE): permuted to pairs like a folder
    soft-capping               {arch}.attn_logit_softcapping (Gemma 2), {arch}.final_logit_softcapping
    window                     {arch}.attention.sliding_window; which layers are local is llama.cpp's rule (every
                               2nd layer global for Gemma 2, every 6th for Gemma 3) unless
                               {arch}.attention.sliding_window_pattern says (a period, or one flag per layer)
    RoPE                       {arch}.rope.freq_base (the global layers'), {arch}.rope.scaling.type/.factor (linear,
                               Gemma 3's global layers); Gemma 3's local base {arch}.rope.freq_base_swa, else
                               llama.cpp's fixed 10,000
    score scale                not stored (query_pre_attn_scalar): llama.cpp's rule, {arch}.attention.scale when a
                               file has it, else 1/sqrt(d_model / heads) for the 27B models (46 layers for Gemma 2,
                               62 for Gemma 3) and 1/sqrt(head_dim) for the others
    head                       tied unless the file holds `output` (llama.cpp drops Gemma 2's lm_head)

The file is read through `f` (txjax.convert.gguf.GGUFFile: get / require by key, path). A value txjax cannot
represent (a scale that is not 1/sqrt of an integer, another RoPE scaling) is a one-line ValueError naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from txjax.convert import gemma
from txjax.convert.hf_folder import Stored
from txjax.model.config import ModelConfig

ARCHITECTURES = {"gemma2": "gemma2", "gemma3": "gemma3_text"}  # GGUF general.architecture -> HF model_type
NAMES = {  # the norm tensors whose names differ from the Llama family's (txjax.convert.gguf._NAMES)
    "blk.{i}.post_attention_norm": "model.layers.{i}.post_attention_layernorm",
    "blk.{i}.ffn_norm": "model.layers.{i}.pre_feedforward_layernorm",
    "blk.{i}.post_ffw_norm": "model.layers.{i}.post_feedforward_layernorm",
}
_GLOBAL_EVERY = {"gemma2": 2, "gemma3": 6}  # llama.cpp's set_swa_pattern(n): layer i is local when i % n < n - 1
_27B_LAYERS = {"gemma2": 46, "gemma3": 62}  # llama.cpp scales these by 1/sqrt(d_model / heads)
_LOCAL_BASE = 10_000.0  # llama.cpp's rope_freq_base_train_swa for Gemma 3


def _layer_types(f, arch: str, layers: int) -> list[str]:
    """Local/global per layer: {arch}.attention.sliding_window_pattern (a period or per-layer flags) or llama.cpp's
    fixed period; every layer global without a window."""
    if f.get(f"{arch}.attention.sliding_window") is None:
        return ["full_attention"] * layers
    pattern = f.get(f"{arch}.attention.sliding_window_pattern", _GLOBAL_EVERY[arch])
    if isinstance(pattern, list):
        if len(pattern) != layers:
            raise ValueError(
                f"{f.path}: {arch}.attention.sliding_window_pattern has {len(pattern)} flags, {layers} layers"
            )
        local = [bool(p) for p in pattern]
    else:
        period = int(pattern)  # llama.cpp's set_swa_pattern: 0 = every layer local
        local = [period == 0 or i % period < period - 1 for i in range(layers)]
    return ["sliding_attention" if is_local else "full_attention" for is_local in local]


def _scale_dim(f, arch: str, d: int, heads: int, head_dim: int, layers: int) -> int:
    """query_pre_attn_scalar as llama.cpp computes the score scale (its f_attention_scale)."""
    scale = f.get(f"{arch}.attention.scale")
    if scale is None:
        return d // heads if layers == _27B_LAYERS[arch] else head_dim
    dim = 1.0 / float(scale) ** 2
    if not np.isclose(dim, round(dim), rtol=1e-5) or round(dim) < 1:
        raise ValueError(
            f"{f.path}: {arch}.attention.scale={scale} is not 1/sqrt of an integer (query_pre_attn_scalar)"
        )
    return round(dim)


def _rope(f, arch: str) -> dict:
    """rope_parameters as transformers 5 writes them for Gemma 2 (one) and Gemma 3 (global and local)."""
    rope = {"rope_type": "default", "rope_theta": float(f.get(f"{arch}.rope.freq_base", 10_000.0))}
    scaling = f.get(f"{arch}.rope.scaling.type", "none")
    if scaling == "linear":
        rope |= {"rope_type": "linear", "factor": float(f.require(f"{arch}.rope.scaling.factor"))}
    elif scaling != "none":
        raise ValueError(f"{f.path}: {arch}.rope.scaling.type={scaling!r} is not supported for {arch} (none, linear)")
    if arch == "gemma2":
        return rope
    local = {"rope_type": "default", "rope_theta": float(f.get(f"{arch}.rope.freq_base_swa", _LOCAL_BASE))}
    return {"full_attention": rope, "sliding_attention": local}


def config_from_gguf(f, has_head: bool) -> ModelConfig:
    """The gemma2 / gemma3 metadata -> ModelConfig, through the config.json txjax.convert.gemma reads."""
    arch = f.require("general.architecture")
    heads, d = int(f.require(f"{arch}.attention.head_count")), int(f.require(f"{arch}.embedding_length"))
    head_dim = int(f.get(f"{arch}.attention.key_length", d // heads))
    layers = int(f.require(f"{arch}.block_count"))
    rope_dim = int(f.get(f"{arch}.rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise ValueError(f"{f.path}: {arch}.rope.dimension_count={rope_dim} (partial RoPE) is not supported")
    caps = {"final_logit_softcapping": f.get(f"{arch}.final_logit_softcapping")}
    if arch == "gemma2":  # Gemma 3 has no attention soft-capping; llama.cpp's converter asserts so
        caps["attn_logit_softcapping"] = f.require(f"{arch}.attn_logit_softcapping")
    hf = {
        "model_type": ARCHITECTURES[arch],
        "vocab_size": int(f.get(f"{arch}.vocab_size", len(f.require("tokenizer.ggml.tokens")))),
        "hidden_size": d,
        "intermediate_size": int(f.require(f"{arch}.feed_forward_length")),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": int(f.get(f"{arch}.attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "max_position_embeddings": int(f.require(f"{arch}.context_length")),
        "rms_norm_eps": float(f.require(f"{arch}.attention.layer_norm_rms_epsilon")),
        "sliding_window": f.get(f"{arch}.attention.sliding_window"),
        "layer_types": _layer_types(f, arch, layers),
        "query_pre_attn_scalar": _scale_dim(f, arch, d, heads, head_dim, layers),
        "rope_parameters": _rope(f, arch),
        "tie_word_embeddings": not has_head,
        **{k: None if v is None else float(v) for k, v in caps.items()},
    }
    return gemma.config_from_hf(hf, has_head)


def _minus_one(s: Stored) -> Stored:
    return Stored(s.shape, s.nbytes, lambda: s.read().astype(np.float32) - 1.0)


def params_from_gguf(tensors: Mapping[str, Stored], cfg: ModelConfig) -> dict:
    """Hugging Face-named tensors of a gemma2/gemma3 file -> DecoderLM params: the norm gains llama.cpp stored as
    1 + w back to w, then txjax.convert.gemma's reader (Q/K rows permuted to pairs)."""
    return gemma.params_from_hf({k: _minus_one(v) if k.endswith("norm.weight") else v for k, v in tensors.items()}, cfg)
