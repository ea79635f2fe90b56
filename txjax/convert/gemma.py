"""Gemma 2 and Gemma 3 (text) checkpoints (Hugging Face Gemma2ForCausalLM, Gemma3ForCausalLM) <-> DecoderLM.

Gemma (Gemma Team 2024, 2025) is a Llama-shaped DecoderLM (txjax.convert.llama: the same attention and FFN tensors,
RoPE with Q/K columns permuted to pairs) with these differences, each a ModelConfig field:

    sandwich norms            t3 = x + LN'(MHA(LN(x))),  h = t3 + LN'(FFN(LN(t3)))        norm_placement='sandwich'
    RMSNorm gains 1 + w       the checkpoint stores w                                       norm_offset
    embeddings * sqrt(d)      Gemma2TextScaledWordEmbedding                                 embed_scale
    GeGLU                     gelu_pytorch_tanh(x W_gate) * x W_up                          activation='geglu'
    score scale               1/sqrt(query_pre_attn_scalar)                                 attention_scale_dim
    soft-capping              attn_logit_softcapping, final_logit_softcapping: c tanh(s / c) attention_softcap,
                                                                                            logit_softcap
    local and global layers   layer_types (sliding_attention / full_attention), sliding_window
                                                                            window_pattern, attention_window
    Gemma 3: q/k RMSNorm      q_norm, k_norm (gains 1 + w too)                              qk_norm
    Gemma 3: two RoPEs        rope_parameters.full_attention (linear factor 8 in the released models) and an
                              unscaled sliding_attention base                               rope_*, rope_local_base

Tensor names are Llama's but for the norms: input_layernorm -> self_attention_norm, post_attention_layernorm ->
self_attention_post_norm, pre_feedforward_layernorm -> ffn_norm, post_feedforward_layernorm -> ffn_post_norm.
Export writes a gemma3_text folder for a model with q/k norms, else gemma2. A config txjax cannot represent (another
activation, biases, bidirectional attention, a scaled local RoPE, another layer type) is a one-line ValueError
naming the config.json field.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from txjax.convert import exportable, hf_folder, llama
from txjax.model.config import ModelConfig

MODEL_TYPES = ("gemma2", "gemma3_text")
_ARCHITECTURES = {"gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM"}
# ModelConfig fields Gemma 2 and 3 fix
_GEMMA_FIELDS = {
    "positional": "rope",
    "norm": "rmsnorm",
    "norm_placement": "sandwich",
    "norm_offset": True,
    "activation": "geglu",
    "use_bias": False,
    "qkv_bias": False,
    "embed_scale": True,
    "attention_scale": "sqrt",
    "rope_fraction": 1.0,
    "parametrization": "standard",
}
_LAYER_TYPES = {"sliding_attention": "L", "full_attention": "G"}
_DEFAULT_THETA = {"gemma2": (10_000.0, None), "gemma3_text": (1_000_000.0, 10_000.0)}  # (global, local) bases
# llama's block reader/writer name the FFN's input norm post_attention_layernorm; Gemma's is pre_feedforward_layernorm
_LLAMA_FFN_NORM = {"post_attention_layernorm.weight": "pre_feedforward_layernorm.weight"}


# ----------------------------------------------------------------------------------------------------------------
# config.json <-> ModelConfig


def window_pattern(layer_types: list) -> str:
    """The shortest 'L'/'G' string whose repetition gives the layer types ('LLLLLG' for Gemma 3's 5:1, 'LG' for
    Gemma 2's alternation); '' when every layer is local (window_pattern's default)."""
    for name in layer_types:
        if name not in _LAYER_TYPES:
            raise ValueError(f"config.json: layer_types holds {name!r} ({', '.join(_LAYER_TYPES)} are supported)")
    kinds = "".join(_LAYER_TYPES[name] for name in layer_types)
    period = next(p for p in range(1, len(kinds) + 1) if all(kinds[i] == kinds[i % p] for i in range(len(kinds))))
    return "" if set(kinds) == {"L"} else kinds[:period]


def _layer_types(hf: Mapping, kind: str) -> list:
    """config.json's layer_types (one per layer, as transformers requires: a shorter list is not repeated), or the
    older configs' rule: every `sliding_window_pattern`-th layer global (Gemma 2: every second)."""
    if hf.get("layer_types"):
        if len(hf["layer_types"]) != hf["num_hidden_layers"]:
            raise ValueError(
                f"config.json: layer_types has {len(hf['layer_types'])} entries for num_hidden_layers="
                f"{hf['num_hidden_layers']} (one per layer)"
            )
        return list(hf["layer_types"])
    every = 2 if kind == "gemma2" else int(hf.get("sliding_window_pattern", 6))
    return ["full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(hf["num_hidden_layers"])]


def _ropes(hf: Mapping, kind: str) -> dict:
    """ModelConfig's rope fields: the global layers' RoPE (llama._rope: its scalings) and Gemma 3's local base, from
    rope_parameters.{full_attention, sliding_attention} or the older rope_theta, rope_scaling, rope_local_base_freq."""
    global_theta, local_theta = _DEFAULT_THETA[kind]
    params = dict(hf.get("rope_parameters") or {})
    if "full_attention" in params or "sliding_attention" in params:  # transformers 5's per-layer-type form
        fields = llama._rope({"rope_theta": global_theta, "rope_parameters": params.get("full_attention")})
        local = dict(params.get("sliding_attention") or {})
        if local.pop("rope_type", "default") != "default" or set(local) - {"rope_theta"}:
            raise ValueError("config.json: rope_parameters.sliding_attention must be unscaled (rope_type default)")
        local_theta = float(local.get("rope_theta", local_theta or fields["rope_base"]))
    else:
        flat = {"rope_theta": hf.get("rope_theta", global_theta), "rope_scaling": hf.get("rope_scaling")}
        fields = llama._rope(flat | {"rope_parameters": params})
        local_theta = float(hf.get("rope_local_base_freq", local_theta)) if local_theta else None
    if kind == "gemma3_text":
        fields["rope_local_base"] = local_theta
    return fields


def config_from_hf(hf: Mapping, has_head: bool) -> ModelConfig:
    """A Gemma 2 / Gemma 3 text config.json (as a dict) -> ModelConfig; `has_head`: the weights hold lm_head.weight
    (decides tying when config.json does not say). Unrepresentable fields are a ValueError naming them."""
    kind = hf.get("model_type")
    if kind == "gemma3":
        raise ValueError("config.json: model_type='gemma3' is the multimodal model; txjax imports its text model")
    if kind not in MODEL_TYPES:
        raise ValueError(f"config.json: model_type={kind!r} is not Gemma 2 or 3 ({', '.join(MODEL_TYPES)})")
    hf_folder.integers(hf, "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
    unsupported = {
        "hidden_activation": ("gelu_pytorch_tanh", "txjax's GeGLU gates with GELU's tanh form"),
        "attention_bias": (False, "txjax's Gemma has no attention biases"),
        "use_bidirectional_attention": (False, "txjax's decoder LM is causal"),
    }
    for name, (want, why) in unsupported.items():
        if (hf.get(name) or want) != want:
            raise ValueError(f"config.json: {name}={hf[name]!r} is not supported ({why})")
    d, h = hf["hidden_size"], hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or d // h
    pattern = window_pattern(_layer_types(hf, kind))
    window = hf.get("sliding_window") or 0
    scale_dim = hf.get("query_pre_attn_scalar", head_dim)
    return ModelConfig(
        vocab_size=hf["vocab_size"],
        d_model=d,
        num_heads=h,
        num_kv_heads=hf.get("num_key_value_heads") or h,
        d_head=None if head_dim * h == d else head_dim,
        d_ff=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"],
        max_len=hf.get("max_position_embeddings", 8192),
        qk_norm=kind == "gemma3_text",
        attention_window=window,
        window_pattern=pattern if window else "",
        attention_scale_dim=0 if scale_dim == head_dim else scale_dim,
        attention_softcap=float(hf.get("attn_logit_softcapping") or 0.0),
        logit_softcap=float(hf.get("final_logit_softcapping") or 0.0),
        tie_embeddings=hf.get("tie_word_embeddings", not has_head),
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        **_ropes(hf, kind),
        init_std=hf.get("initializer_range", 0.02),
        attention_dropout=hf.get("attention_dropout") or 0.0,
        dropout=0.0,
        **_GEMMA_FIELDS,
    )


def config_to_hf(cfg: ModelConfig, bos_id: int | None = None, eos_id: int | None = None) -> dict:
    """ModelConfig -> a config.json that Gemma3ForCausalLM (a model with q/k norms) or Gemma2ForCausalLM loads; a
    field it cannot hold is refused when it is read back (exportable.check_fields)."""
    kind = "gemma3_text" if cfg.qk_norm else "gemma2"
    rope = llama._rope_to_hf(cfg)
    if kind == "gemma2" and cfg.rope_local_base:
        raise ValueError("model.rope_local_base: Gemma 2 has one RoPE (Gemma 3, with model.qk_norm, has a local one)")
    if kind == "gemma3_text":
        local = {"rope_type": "default", "rope_theta": cfg.rope_local_base or cfg.rope_base}
        rope = {"full_attention": rope, "sliding_attention": local}
    types = ["sliding_attention" if window else "full_attention" for window in cfg.layer_windows]
    return {
        "architectures": [_ARCHITECTURES[kind]],
        "model_type": kind,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.d_ff,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": cfg.max_len,
        "rms_norm_eps": cfg.norm_eps,
        "rope_parameters": rope,
        "layer_types": types,
        "sliding_window": cfg.attention_window or None,
        "query_pre_attn_scalar": cfg.attention_scale_dim or cfg.head_dim,
        "attn_logit_softcapping": cfg.attention_softcap or None,
        "final_logit_softcapping": cfg.logit_softcap or None,
        "tie_word_embeddings": cfg.tie_embeddings,
        "initializer_range": cfg.init_std,
        "attention_dropout": cfg.attention_dropout,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": None,
        "dtype": "float32",
        "use_cache": True,
    }


# ----------------------------------------------------------------------------------------------------------------
# tensors <-> params


def _layer_from_hf(get: Callable, cfg: ModelConfig, to_pairs: np.ndarray) -> dict:
    """One block's params: llama's (attention, FFN, q/k norms, the input norms) and Gemma's two output norms."""
    layer = llama.layer_from_hf(lambda name, shape: get(_LLAMA_FFN_NORM.get(name, name), shape), cfg, to_pairs)
    layer["self_attention_post_norm"] = {"scale": get("post_attention_layernorm.weight", (cfg.d_model,))}
    layer["ffn_post_norm"] = {"scale": get("post_feedforward_layernorm.weight", (cfg.d_model,))}
    return layer


def _layer_to_hf(p: Mapping, cfg: ModelConfig) -> dict:
    """Inverse of _layer_from_hf."""
    out = {_LLAMA_FFN_NORM.get(k, k): v for k, v in llama.layer_to_hf(p, cfg).items()}
    out["post_attention_layernorm.weight"] = p["self_attention_post_norm"]["scale"]
    out["post_feedforward_layernorm.weight"] = p["ffn_post_norm"]["scale"]
    return out


def params_from_hf(tensors: Mapping[str, np.ndarray], cfg: ModelConfig, *, pairs_layout: bool = False) -> dict:
    """HF Gemma 2/3 tensors -> DecoderLM params (llama.params_from_hf with Gemma's blocks)."""
    return llama.params_from_hf(
        tensors, cfg, pairs_layout=pairs_layout, layers=llama.each_layer_from_hf(_layer_from_hf)
    )


def params_to_hf(params: Mapping, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """DecoderLM params -> HF tensors named as Gemma2/3ForCausalLM.save_pretrained names them."""
    return llama.params_to_hf(params, cfg, layers=llama.each_layer_to_hf(_layer_to_hf))


# ----------------------------------------------------------------------------------------------------------------
# folders


def load_gemma(folder) -> tuple[ModelConfig, dict]:
    """A save_pretrained Gemma 2 / Gemma 3 text folder -> (ModelConfig, DecoderLM params as float32 numpy)."""
    return hf_folder.load_decoder_folder(folder, config_from_hf, params_from_hf)


_FOLDER = exportable.DecoderFolder(config_to_hf, config_from_hf, params_to_hf)
write_gemma, save_gemma = _FOLDER.write, _FOLDER.save
