"""Llama-family checkpoints (Hugging Face LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM,
SmolLM3ForCausalLM) <-> DecoderLM.

Llama (Touvron et al. 2023) is a DecoderLM with RoPE, pre-RMSNorm blocks and a final RMSNorm, a SwiGLU FFN
down(silu(x W_gate) * x W_up), grouped-query attention, no biases (Qwen2: biases on q/k/v), and a head tied to the
token embedding or not. Hugging Face Linear weights are [out, in] (y = x W^T), so txjax kernels are transposes:

    model.embed_tokens.weight [V, D]      -> embed.tokens.embedding;  lm_head.weight [V, D] -> embed.lm_head [D, V]
    layers.i.input_layernorm, post_attention_layernorm, model.norm -> self_attention_norm, ffn_norm, final_norm
    layers.i.self_attn.q_proj [H*K, D]    -> query [D, H, K]  (k_proj, v_proj: [G*K, D] -> key, value [D, G, K])
    layers.i.self_attn.o_proj [D, H*K]    -> out [H, K, D]
    layers.i.mlp.gate_proj, up_proj [F, D], down_proj [D, F] -> ffn.wi, ffn.wi_gate [D, F], ffn.wo [F, D]
    layers.i.self_attn.q_norm, k_norm [K] (Qwen3: RMSNorm of each head before RoPE) -> query_norm, key_norm

RoPE's scalings (rope_parameters.rope_type linear, llama3, yarn: Llama 3.x) map to model.rope_scaling and its
parameters, Mistral's sliding_window to model.attention_window (every layer local), SmolLM3's no_rope_layers (1: RoPE,
0: none, one per layer) to model.rope_layers (one R or N per layer); attention_bias (q, k, v and o_proj) to
model.attention_bias, which GPT-OSS's attention shares with its sinks (txjax.convert.moe).

RoPE layout. Hugging Face rotates channel i of a head with channel i + K/2 (`rotate_half`); txjax's apply_rope
rotates the adjacent pair (2i, 2i+1), both by the angle p * base^(-2i/K). Scores q . k are sums over channels, so
one permutation applied to the query and key channels of every head changes nothing but the layout: txjax
channel 2i is HF channel i and 2i+1 is HF channel i + K/2 (`PAIRS`); with partial rotary (model.rope_fraction: the
first R channels rotate) the same within those R, the rest in place (`rope_pairs`). Q/K weights (Qwen2's biases,
Qwen3's norm gains) are permuted on the way in and back on the way out; llama.cpp's GGUF files already store them
in pair order (`pairs=True`).

A config txjax cannot represent (another rope_type or its parameter, Qwen's per-layer sliding window, biases Llama
puts where txjax has none, another activation) is a one-line ValueError naming the config.json field.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import numpy as np

from txjax.convert import exportable, hf_folder
from txjax.model.config import ModelConfig

MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "smollm3")
_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "smollm3": "SmolLM3ForCausalLM",
}
# ModelConfig fields the Llama family fixes
_LLAMA_FIELDS = {
    "positional": "rope",
    "norm": "rmsnorm",
    "norm_placement": "pre",
    "activation": "swiglu",
    "use_bias": False,
    "embed_scale": False,
    "attention_scale": "sqrt",
    "logit_softcap": 0.0,
    "parametrization": "standard",
}
_BUFFERS = ("rotary_emb.inv_freq",)  # old checkpoints store RoPE's frequencies; they are recomputed


def pairs(k: int) -> np.ndarray:
    """The channel permutation from HF's half layout to txjax's pair layout: txjax channel c is HF channel
    PAIRS[c] = [0, K/2, 1, K/2 + 1, ...]; its inverse argsort(PAIRS) goes back."""
    return np.stack([np.arange(k // 2), np.arange(k // 2) + k // 2], axis=1).reshape(-1)


def rope_pairs(cfg: ModelConfig) -> np.ndarray:
    """`pairs` over the channels RoPE rotates (the first rope_fraction of a head's), the others kept in place."""
    rotated = int(cfg.head_dim * cfg.rope_fraction)
    return np.concatenate([pairs(rotated), np.arange(rotated, cfg.head_dim)])


# ----------------------------------------------------------------------------------------------------------------
# config.json <-> ModelConfig


# transformers' rope parameters -> ModelConfig fields (the scaling kinds txjax.model.positional.Rope has)
_ROPE_FIELDS = {
    "factor": "rope_factor",
    "low_freq_factor": "rope_low_freq_factor",
    "high_freq_factor": "rope_high_freq_factor",
    "original_max_position_embeddings": "rope_original_max_len",
    "beta_fast": "rope_beta_fast",
    "beta_slow": "rope_beta_slow",
    "attention_factor": "rope_attention_factor",
    "truncate": "rope_truncate",
}
_ROPE_TYPES = {"default": "none", "linear": "linear", "llama3": "llama3", "yarn": "yarn"}


def _rope(hf: Mapping) -> dict:
    """ModelConfig's rope fields from transformers 5's rope_parameters or the older top-level rope_theta /
    rope_scaling (None values: transformers' defaults, as txjax's); a rope_type or parameter txjax lacks is a
    ValueError naming it."""
    fields = {"rope_base": float(hf.get("rope_theta", 10000.0))}
    for name in ("rope_scaling", "rope_parameters"):  # the newer last: it wins
        section = dict(hf.get(name) or {})
        if not section:
            continue
        kind = section.pop("rope_type", section.pop("type", "default"))
        if kind not in _ROPE_TYPES:
            raise ValueError(f"config.json: {name}.rope_type={kind!r} is not supported ({', '.join(_ROPE_TYPES)})")
        fields["rope_base"] = float(section.pop("rope_theta", fields["rope_base"]))
        fields["rope_scaling"] = _ROPE_TYPES[kind]
        for key, value in section.items():
            if value is None or (key, value) == ("partial_rotary_factor", 1.0):
                continue
            if kind == "default" or key not in _ROPE_FIELDS:
                raise ValueError(f"config.json: {name}.{key}={value!r} is not supported for rope_type {kind!r}")
            fields[_ROPE_FIELDS[key]] = type(ModelConfig.__dataclass_fields__[_ROPE_FIELDS[key]].default)(value)
    return fields


def _rope_to_hf(cfg: ModelConfig) -> dict:
    """ModelConfig's rope fields -> transformers' rope_parameters."""
    kind = {v: k for k, v in _ROPE_TYPES.items()}[cfg.rope_scaling]
    out = {"rope_type": kind, "rope_theta": cfg.rope_base}
    if kind != "default":
        used = {
            "linear": ("factor",),
            "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
            "yarn": ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor"),
        }[kind] + (("truncate",) if kind == "yarn" else ())
        out |= {key: getattr(cfg, _ROPE_FIELDS[key]) for key in used}
        if kind == "yarn" and not cfg.rope_attention_factor:
            del out["attention_factor"]  # transformers derives it from the factor as txjax does
    return out


def config_from_hf(hf: Mapping, has_head: bool) -> ModelConfig:
    """A Llama/Mistral/Qwen2 config.json (as a dict) -> ModelConfig; `has_head`: the weights hold lm_head.weight
    (decides tying when config.json does not say). Unrepresentable fields are a ValueError naming them."""
    kind = hf.get("model_type")
    if kind not in MODEL_TYPES:
        raise ValueError(f"config.json: model_type={kind!r} is not a Llama-family model ({', '.join(MODEL_TYPES)})")
    hf_folder.integers(hf, "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
    unsupported = {
        "hidden_act": ("silu", "txjax's SwiGLU gates with silu"),
        "mlp_bias": (False, "txjax's SwiGLU has no biases"),
        "use_sliding_window": (False, "Qwen's window spares the first max_window_layers layers: txjax has none"),
        "partial_rotary_factor": (1.0, "Llama rotates every channel"),
    }
    for name, (want, why) in unsupported.items():
        if hf.get(name, want) != want:
            raise ValueError(f"config.json: {name}={hf[name]!r} is not supported ({why})")
    max_len = hf.get("max_position_embeddings", 2048)
    window = hf.get("sliding_window") if kind == "mistral" else None  # Qwen's applies only with use_sliding_window
    d, h = hf["hidden_size"], hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or d // h
    layers = hf["num_hidden_layers"]
    flags = (hf.get("no_rope_layers") or [1] * layers)[:layers] if kind == "smollm3" else []
    ropes = "".join("R" if on else "N" for on in flags)
    return ModelConfig(
        vocab_size=hf["vocab_size"],
        d_model=d,
        num_heads=h,
        num_kv_heads=hf.get("num_key_value_heads") or h,
        d_head=None if head_dim * h == d else head_dim,
        d_ff=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"],
        max_len=max_len,
        qkv_bias=kind == "qwen2",
        attention_bias=bool(hf.get("attention_bias", False)),
        qk_norm=kind == "qwen3",
        attention_window=window if window is not None and window < max_len else 0,
        rope_layers="" if set(ropes) <= {"R"} else ropes,
        tie_embeddings=hf.get("tie_word_embeddings", not has_head),
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        **_rope(hf),
        init_std=hf.get("initializer_range", 0.02),
        attention_dropout=hf.get("attention_dropout", 0.0),
        dropout=0.0,
        **_LLAMA_FIELDS,
    )


def config_to_hf(cfg: ModelConfig, bos_id: int | None = None, eos_id: int | None = None) -> dict:
    """ModelConfig -> a config.json that LlamaForCausalLM loads (Qwen2ForCausalLM with q/k/v biases, Qwen3ForCausalLM
    with q/k norms, MistralForCausalLM with a window in every layer); a field it cannot hold is refused when it is
    read back (exportable.check_fields)."""
    features = (("qwen2", cfg.qkv_bias), ("qwen3", cfg.qk_norm), ("mistral", cfg.attention_window))
    kinds = [k for k, on in (*features, ("smollm3", cfg.rope_layers)) if on]
    if len(kinds) > 1:
        raise ValueError(f"model: {' and '.join(kinds)} features together have no Hugging Face architecture")
    kind = kinds[0] if kinds else "llama"
    if cfg.attention_bias and kind != "llama":
        raise ValueError(f"model.attention_bias=true cannot be exported to {kind} (LlamaForCausalLM holds it)")
    extra = {"sliding_window": cfg.attention_window} if kind == "mistral" else {}
    if kind == "smollm3":  # one flag per layer (transformers' no_rope_layer_interval would make its own)
        extra = {"no_rope_layers": [int(layer.rope) for layer in cfg.layer_attention], "use_sliding_window": False}
        extra["pad_token_id"] = None  # SmolLM3Config's default, 128004, is past a smaller vocabulary
    return extra | {
        "architectures": [_ARCHITECTURES[kind]],
        "model_type": kind,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.d_ff,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "attention_bias": cfg.attention_bias,
        "max_position_embeddings": cfg.max_len,
        "rms_norm_eps": cfg.norm_eps,
        "rope_parameters": _rope_to_hf(cfg),
        "rope_theta": cfg.rope_base,
        "tie_word_embeddings": cfg.tie_embeddings,
        "initializer_range": cfg.init_std,
        "attention_dropout": cfg.attention_dropout,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "dtype": "float32",
        "use_cache": True,
    }


# ----------------------------------------------------------------------------------------------------------------
# tensors <-> params


MLP_NAMES = ("gate_proj", "up_proj", "down_proj")  # SwiGLU's W1 (gated by silu), W3, W2


def ffn_from_hf(get: Callable, d: int, f: int, names=MLP_NAMES) -> dict:
    """A SwiGLU FFN's params from `get(name, shape)`: `names` (gate, up, down) [F, D], [F, D], [D, F] -> ffn.wi,
    wi_gate [D, F], wo [F, D]."""
    kernel = lambda name, shape: {"kernel": get(f"{name}.weight", shape).T}
    return {"wi": kernel(names[0], (f, d)), "wi_gate": kernel(names[1], (f, d)), "wo": kernel(names[2], (d, f))}


def ffn_to_hf(ffn: Mapping, names=MLP_NAMES) -> dict:
    """Inverse of ffn_from_hf: {`name`.weight: array}."""
    return {f"{n}.weight": ffn[key]["kernel"].T for n, key in zip(names, ("wi", "wi_gate", "wo"), strict=True)}


def attention_from_hf(get: Callable, cfg: ModelConfig, to_pairs: np.ndarray) -> dict:
    """A block's attention and its two norms from `get(name, shape)` (HF tensor `model.layers.i.<name>` as float32
    of that shape); q/k norm gains of each head, or (qk_norm_all_heads, OLMoE) of the whole projection [H K]."""
    d, h, g, k = cfg.d_model, cfg.num_heads, cfg.kv_heads, cfg.head_dim
    norm = lambda name: {"scale": get(f"{name}.weight", (d,))}
    attn = {
        "query": get("self_attn.q_proj.weight", (h * k, d)).T.reshape(d, h, k)[..., to_pairs],
        "key": get("self_attn.k_proj.weight", (g * k, d)).T.reshape(d, g, k)[..., to_pairs],
        "value": get("self_attn.v_proj.weight", (g * k, d)).T.reshape(d, g, k),
        "out": get("self_attn.o_proj.weight", (d, h * k)).T.reshape(h, k, d),
    }
    for ours, theirs, heads in (("query_norm", "q_norm", h), ("key_norm", "k_norm", g)) if cfg.qk_norm else ():
        n = heads if cfg.qk_norm_all_heads else 1  # OLMoE's gains span the whole projection
        scale = get(f"self_attn.{theirs}.weight", (n * k,)).reshape(n, k)[..., to_pairs]
        attn[ours] = {"scale": scale if cfg.qk_norm_all_heads else scale[0]}
    if cfg.qkv_bias or cfg.attention_bias:
        attn["query_bias"] = get("self_attn.q_proj.bias", (h * k,)).reshape(h, k)[..., to_pairs]
        attn["key_bias"] = get("self_attn.k_proj.bias", (g * k,)).reshape(g, k)[..., to_pairs]
        attn["value_bias"] = get("self_attn.v_proj.bias", (g * k,)).reshape(g, k)
    if cfg.attention_bias:
        attn["out_bias"] = get("self_attn.o_proj.bias", (d,))
    if cfg.attention_sinks:  # GPT-OSS: one logit per head
        attn["sinks"] = get("self_attn.sinks", (h,))
    return {
        "self_attention_norm": norm("input_layernorm"),
        "self_attention": attn,
        "ffn_norm": norm("post_attention_layernorm"),
    }


def layer_from_hf(get: Callable, cfg: ModelConfig, to_pairs: np.ndarray) -> dict:
    """One Llama block from `get(name, shape)` (HF tensor `model.layers.i.<name>`): attention, norms, SwiGLU FFN."""
    return attention_from_hf(get, cfg, to_pairs) | {
        "ffn": ffn_from_hf(lambda n, s: get(f"mlp.{n}", s), cfg.d_model, cfg.d_ff)
    }


def each_layer_from_hf(layer: Callable) -> Callable:
    """params_from_hf's `layers` for a family whose blocks are all read by `layer(get, cfg, to_pairs)`:
    layers_0 ... from `get(i, name, shape)`."""
    return lambda get, cfg, to_pairs: {
        f"layers_{i}": layer(functools.partial(get, i), cfg, to_pairs) for i in range(cfg.num_layers)
    }


def attention_to_hf(p: Mapping, cfg: ModelConfig, pairs_layout: bool = False) -> dict:
    """Inverse of attention_from_hf: one block's attention and norms -> {name: array} without `model.layers.i.`
    (pairs_layout: the format rotates adjacent pairs as txjax does, so no channel is permuted)."""
    d = cfg.d_model
    to_halves = np.arange(cfg.head_dim) if pairs_layout else np.argsort(rope_pairs(cfg))
    a = p["self_attention"]
    out = {
        "self_attn.q_proj.weight": a["query"][..., to_halves].reshape(d, -1).T,
        "self_attn.k_proj.weight": a["key"][..., to_halves].reshape(d, -1).T,
        "self_attn.v_proj.weight": a["value"].reshape(d, -1).T,
        "self_attn.o_proj.weight": a["out"].reshape(-1, d).T,
        "input_layernorm.weight": p["self_attention_norm"]["scale"],
        "post_attention_layernorm.weight": p["ffn_norm"]["scale"],
    }
    if cfg.qk_norm:  # [K] per head, or [H, K] over the whole projection: flattened either way
        out["self_attn.q_norm.weight"] = a["query_norm"]["scale"][..., to_halves].reshape(-1)
        out["self_attn.k_norm.weight"] = a["key_norm"]["scale"][..., to_halves].reshape(-1)
    if cfg.qkv_bias or cfg.attention_bias:
        out["self_attn.q_proj.bias"] = a["query_bias"][..., to_halves].reshape(-1)
        out["self_attn.k_proj.bias"] = a["key_bias"][..., to_halves].reshape(-1)
        out["self_attn.v_proj.bias"] = a["value_bias"].reshape(-1)
    if cfg.attention_bias:
        out["self_attn.o_proj.bias"] = a["out_bias"]
    if cfg.attention_sinks:
        out["self_attn.sinks"] = a["sinks"]
    return out


def layer_to_hf(p: Mapping, cfg: ModelConfig) -> dict:
    """Inverse of layer_from_hf: one block's tensors (names without `model.layers.i.`)."""
    return attention_to_hf(p, cfg) | {f"mlp.{k}": v for k, v in ffn_to_hf(p["ffn"]).items()}


def each_layer_to_hf(layer: Callable) -> Callable:
    """params_to_hf's `layers` for a family whose blocks are all written by `layer(params, cfg)`."""
    return lambda dec, cfg: [layer(dec[f"layers_{i}"], cfg) for i in range(cfg.num_layers)]


def params_from_hf(
    tensors: Mapping[str, np.ndarray],
    cfg: ModelConfig,
    *,
    pairs_layout: bool = False,
    layers: Callable | None = None,
    more: Callable | None = None,
) -> dict:
    """HF Llama-family tensors (`model.` prefix or not) -> DecoderLM params, float32, layers stacked when
    cfg.scan_layers. pairs_layout: the Q/K rows already rotate adjacent pairs (GGUF), so none is permuted.
    layers(get, cfg, to_pairs): the decoder's layer entries (default: Llama blocks; another FFN: txjax.convert.moe;
    other norms: .gemma); more(get, cfg, params): entries beside embed and decoder (DeepSeek-V3's MTP modules). A
    missing, extra or misshapen tensor is a ValueError naming it."""
    layers = layers or each_layer_from_hf(layer_from_hf)
    t = hf_folder.Tensors(tensors, "model.")
    to_pairs = np.arange(cfg.head_dim) if pairs_layout else rope_pairs(cfg)
    d, v = cfg.d_model, cfg.vocab_size
    embed = {"tokens": {"embedding": t.get("embed_tokens.weight", (v, d))}}
    if not cfg.tie_embeddings:
        embed["lm_head"] = {"kernel": t.get("lm_head.weight", (v, d)).T}
    elif "lm_head.weight" in t:  # a tied checkpoint may store the head too; it must be the embedding
        if not hf_folder.same(t.get("lm_head.weight", (v, d)), embed["tokens"]["embedding"]):
            raise ValueError(
                f"{hf_folder.HF_CONFIG_FILE}: tie_word_embeddings is true but lm_head.weight differs from the embedding"
            )
    decoder = layers(lambda i, name, shape: t.get(f"layers.{i}.{name}", shape), cfg, to_pairs)
    decoder["final_norm"] = {"scale": t.get("norm.weight", (d,))}
    params = {"embed": embed, "decoder": decoder}
    return t.finish(params | (more(t.get, cfg, params) if more else {}), cfg, _BUFFERS)


def params_to_hf(params: Mapping, cfg: ModelConfig, layers: Callable | None = None) -> dict[str, np.ndarray]:
    """DecoderLM params (scanned or looped) -> HF tensors named as LlamaForCausalLM.save_pretrained names them
    (layers(decoder, cfg): each HF layer's tensors, as each_layer_to_hf's; default: Llama blocks)."""
    layers = layers or each_layer_to_hf(layer_to_hf)
    params = exportable.looped(params, cfg)
    dec = params["decoder"]
    out = {
        "model.embed_tokens.weight": params["embed"]["tokens"]["embedding"],
        "model.norm.weight": dec["final_norm"]["scale"],
    }
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = params["embed"]["lm_head"]["kernel"].T
    for i, tensors in enumerate(layers(dec, cfg)):
        out.update({f"model.layers.{i}.{k}": v for k, v in tensors.items()})
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


# ----------------------------------------------------------------------------------------------------------------
# folders


def load_llama(folder) -> tuple[ModelConfig, dict]:
    """A save_pretrained Llama/Mistral/Qwen2 folder -> (ModelConfig, DecoderLM params as float32 numpy)."""
    return hf_folder.load_decoder_folder(folder, config_from_hf, params_from_hf)


_FOLDER = exportable.DecoderFolder(config_to_hf, config_from_hf, params_to_hf)
write_llama, save_llama = _FOLDER.write, _FOLDER.save
