"""Qwen3-Next checkpoints (Hugging Face Qwen3NextForCausalLM, model_type qwen3_next) <-> DecoderLM.

Gated DeltaNet layers (txjax.model.gated_deltanet) beside gated full attention, each layer's FFN Qwen2-MoE's mixture
of experts (txjax.convert.moe reads and writes it: softmax then top-k, norm_topk_prob, a shared expert scaled by
sigmoid(x w_s), decoder_sparse_step) or a dense SwiGLU; the embeddings, norms and head as Llama's (txjax.convert.llama):
    layer_types (linear_attention / full_attention per layer) -> model.layer_types, its shortest period in L / F
    linear_num_key_heads, linear_num_value_heads, linear_key_head_dim, linear_value_head_dim, linear_conv_kernel_dim
                                         -> model.linear_heads, linear_v_heads, linear_head_dim, linear_v_head_dim,
                                            linear_conv
    every RMSNorm's gain 1 + w, w stored -> model.norm_offset (the Gated DeltaNet's gated norm excepted: its gain is w)
    the query projection doubled, per head [q ; g], attention's output times sigmoid(g) -> model.attention_output_gate
    partial_rotary_factor (rotate_half over a head's first channels) -> model.rope_fraction (llama.rope_pairs)
    per-head q/k RMSNorm                 -> model.qk_norm
Per layer, HF [out, in] weights transposed (Hk key heads of Dk, Hv = r Hk value heads of Dv, D = hidden_size):
    linear_attn.in_proj_qkvz [2 Hk Dk + 2 Hv Dv, D], per key head [q ; k ; its r heads' v ; their z]
                                         -> linear_attention.query, key [D, Hk, Dk], value, gate [D, Hv, Dv]
    linear_attn.in_proj_ba [2 Hv, D], per key head [its r heads' b ; their a] -> linear_attention.beta, decay [D, Hv]
    linear_attn.conv1d.weight [C, 1, W] -> conv [W, C];  A_log, dt_bias [Hv];  norm.weight [Dv] -> norm
    linear_attn.out_proj [D, Hv Dv]      -> out [Hv, Dv, D]
    self_attn.q_proj [2 H K, D], per head [q ; g] -> self_attention.query (RoPE's channels to pairs), gate [D, H, K]
    input_layernorm                      -> linear_attention_norm or self_attention_norm (the layer's mixer's)
Not imported: the multi-token-prediction weights (mtp.*), which transformers does not load either. A config txjax
cannot represent (mlp_only_layers that make an MoE layer dense, another layer type, a shared expert width that is
not a multiple of an expert's) is a one-line ValueError naming the config.json field.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Mapping

import numpy as np

from txjax.convert import exportable, hf_folder, llama, moe
from txjax.model.config import ModelConfig
from txjax.model.linear_config import linear_sizes

MODEL_TYPES = ("qwen3_next",)
_MIXERS = {"linear_attention": "L", "full_attention": "F"}
_LINEAR_SIZES = {  # config.json -> ModelConfig
    "linear_num_key_heads": "linear_heads",
    "linear_num_value_heads": "linear_v_heads",
    "linear_key_head_dim": "linear_head_dim",
    "linear_value_head_dim": "linear_v_head_dim",
    "linear_conv_kernel_dim": "linear_conv",
}


# ----------------------------------------------------------------------------------------------------------------
# config.json <-> ModelConfig


def _layer_types(hf: Mapping) -> str:
    """model.layer_types: config.json's layer_types (or its full_attention_interval's) as their shortest period."""
    layers = hf["num_hidden_layers"]
    interval = hf.get("full_attention_interval", 4)
    types = hf.get("layer_types") or [
        "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)
    ]
    if len(types) != layers or set(types) - set(_MIXERS):
        raise ValueError(
            f"config.json: layer_types={types!r} must name linear_attention or full_attention for each of the "
            f"num_hidden_layers={layers}"
        )
    letters = "".join(_MIXERS[t] for t in types)
    period = next(p for p in range(1, layers + 1) if layers % p == 0 and letters == letters[:p] * (layers // p))
    return "" if "L" not in letters else letters[:period]


def config_from_hf(hf: Mapping, has_head: bool) -> ModelConfig:
    """A Qwen3-Next config.json (as a dict) -> ModelConfig; `has_head`: the weights hold lm_head.weight.
    Unrepresentable fields are a ValueError naming them."""
    if hf.get("model_type") not in MODEL_TYPES:
        raise ValueError(f"config.json: model_type={hf.get('model_type')!r} is not {MODEL_TYPES[0]!r}")
    hf_folder.integers(hf, "num_hidden_layers", *_LINEAR_SIZES)
    rope = dict(hf.get("rope_parameters") or {})
    fraction = float(rope.pop("partial_rotary_factor", hf.get("partial_rotary_factor", 0.25)))  # transformers' 0.25
    plain = {k: v for k, v in hf.items() if k != "partial_rotary_factor"} | {"rope_parameters": rope}
    experts = bool(hf.get("num_experts"))  # Qwen2-MoE's experts and routing, or none: Llama's dense FFN
    read = moe.config_from_hf if experts else llama.config_from_hf
    base = read(plain | {"model_type": "qwen2_moe" if experts else "llama", "qkv_bias": False}, has_head)
    return dataclasses.replace(
        base,
        qk_norm=True,
        norm_offset=True,
        attention_output_gate=True,
        rope_fraction=fraction,
        layer_types=_layer_types(hf),
        **{ours: hf[theirs] for theirs, ours in _LINEAR_SIZES.items()},
    )


def config_to_hf(cfg: ModelConfig, bos_id: int | None = None, eos_id: int | None = None) -> dict:
    """ModelConfig -> a config.json Qwen3NextForCausalLM loads; a field it cannot hold is refused when it is read
    back (exportable.check_fields)."""
    plain = dataclasses.replace(cfg, qk_norm=False, attention_bias=False, rope_fraction=1.0)
    hf = llama.config_to_hf(plain, bos_id, eos_id)  # the attention's sizes, norms, RoPE; Qwen3-Next's follow
    size = linear_sizes(cfg)  # the sizes a 0 field takes (its LinearSizes name: the field's without linear_)
    hf |= {theirs: getattr(size, ours.removeprefix("linear_")) for theirs, ours in _LINEAR_SIZES.items()}
    hf |= {
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": MODEL_TYPES[0],
        "attention_bias": cfg.attention_bias,
        "rope_parameters": hf["rope_parameters"] | {"partial_rotary_factor": cfg.rope_fraction},
        "layer_types": ["linear_attention" if layer.linear else "full_attention" for layer in cfg.layer_attention],
        "num_experts": cfg.num_experts,
        "mlp_only_layers": [],
        "output_router_logits": False,
    }
    if cfg.num_experts:
        hf |= {"num_experts_per_tok": cfg.experts_per_token, "moe_intermediate_size": cfg.expert_d_ff}
        hf |= {"shared_expert_intermediate_size": cfg.num_shared_experts * cfg.expert_d_ff}
        hf |= {"decoder_sparse_step": cfg.moe_every, "norm_topk_prob": cfg.moe_norm_topk}
    return hf


# ----------------------------------------------------------------------------------------------------------------
# tensors <-> params


def _group_size(cfg: ModelConfig) -> int:
    """How many layers each of DecoderLM(cfg)'s stacked units holds (txjax.model.layers.Group's block_0 ...; 1: the
    blocks themselves), read off the model's own parameter tree."""
    decoder = hf_folder.expected_shapes(cfg)["decoder"]
    unit = decoder.get("layers", decoder.get("layers_0"))
    return sum(bool(re.fullmatch(r"block_\d+", key)) for key in unit) or 1


def _linear_from_hf(get: Callable, cfg: ModelConfig) -> dict:
    """A Gated DeltaNet layer's params (the module docstring's table) from get(name, shape)."""
    s, d = linear_sizes(cfg), cfg.d_model
    r, k, v = s.v_heads // s.heads, s.head_dim, s.v_head_dim
    get_t = lambda name, *shape: get(f"linear_attn.{name}", shape).T
    qkvz = get_t("in_proj_qkvz.weight", 2 * s.heads * k + 2 * s.v_heads * v, d).reshape(d, s.heads, -1)
    ba = get_t("in_proj_ba.weight", 2 * s.v_heads, d).reshape(d, s.heads, 2 * r)
    return {
        "query": qkvz[..., :k],
        "key": qkvz[..., k : 2 * k],
        "value": qkvz[..., 2 * k : 2 * k + r * v].reshape(d, s.v_heads, v),
        "gate": qkvz[..., 2 * k + r * v :].reshape(d, s.v_heads, v),
        "beta": ba[..., :r].reshape(d, s.v_heads),
        "decay": ba[..., r:].reshape(d, s.v_heads),
        "conv": get_t("conv1d.weight", s.conv_channels, 1, s.conv)[:, 0],
        "A_log": get("linear_attn.A_log", (s.v_heads,)),
        "dt_bias": get("linear_attn.dt_bias", (s.v_heads,)),
        "norm": get("linear_attn.norm.weight", (v,)),
        "out": get_t("out_proj.weight", d, s.v_heads * v).reshape(s.v_heads, v, d),
    }


def _linear_to_hf(p: Mapping, cfg: ModelConfig) -> dict:
    """Inverse of _linear_from_hf: {name: array} without `model.layers.i.`."""
    s, d = linear_sizes(cfg), cfg.d_model
    grouped = lambda name: p[name].reshape(d, s.heads, -1)  # [D, Hk, r ...]: a key head's value heads side by side
    qkvz = np.concatenate([p["query"], p["key"], grouped("value"), grouped("gate")], axis=-1)
    ba = np.concatenate([grouped("beta"), grouped("decay")], axis=-1)
    return {
        "linear_attn.in_proj_qkvz.weight": qkvz.reshape(d, -1).T,
        "linear_attn.in_proj_ba.weight": ba.reshape(d, -1).T,
        "linear_attn.conv1d.weight": p["conv"].T[:, None],
        "linear_attn.A_log": p["A_log"],
        "linear_attn.dt_bias": p["dt_bias"],
        "linear_attn.norm.weight": p["norm"],
        "linear_attn.out_proj.weight": p["out"].reshape(-1, d).T,
    }


def _attention_from_hf(get: Callable, cfg: ModelConfig, to_pairs: np.ndarray) -> dict:
    """A full-attention layer's attention and norms: Llama's (Qwen3's q/k norms), its doubled query projection split
    into the query and the output gate (a bias likewise)."""
    h, k, d = cfg.num_heads, cfg.head_dim, cfg.d_model
    halves = {"weight": (2 * h * k, d), "bias": (2 * h * k,)} if cfg.attention_bias else {"weight": (2 * h * k, d)}
    doubled = {n: get(f"self_attn.q_proj.{n}", shape).reshape(h, 2, k, *shape[1:]) for n, shape in halves.items()}
    query = {f"self_attn.q_proj.{n}": t[:, 0].reshape(h * k, *t.shape[3:]) for n, t in doubled.items()}
    read = lambda name, shape: query[name] if name in query else get(name, shape)
    layer = llama.attention_from_hf(read, cfg, to_pairs)
    layer["self_attention"]["gate"] = doubled["weight"][:, 1].reshape(h * k, d).T.reshape(d, h, k)
    if cfg.attention_bias:
        layer["self_attention"]["gate_bias"] = doubled["bias"][:, 1]
    return layer


def _attention_to_hf(p: Mapping, cfg: ModelConfig) -> dict:
    """Inverse of _attention_from_hf."""
    out, a = llama.attention_to_hf(p, cfg), p["self_attention"]
    h, k, d = cfg.num_heads, cfg.head_dim, cfg.d_model
    gate = a["gate"].reshape(d, h * k).T.reshape(h, 1, k, d)
    query = out["self_attn.q_proj.weight"].reshape(h, 1, k, d)
    out["self_attn.q_proj.weight"] = np.concatenate([query, gate], axis=1).reshape(2 * h * k, d)
    if cfg.attention_bias:
        query = out["self_attn.q_proj.bias"].reshape(h, 1, k)
        out["self_attn.q_proj.bias"] = np.concatenate([query, a["gate_bias"][:, None]], axis=1).reshape(-1)
    return out


def _layers_from_hf(get: Callable, cfg: ModelConfig, to_pairs: np.ndarray) -> dict:
    """The decoder's layers (llama.params_from_hf's `layers`): layer i at layers_{i // n}.block_{i % n} for
    groups of n (_group_size), at layers_i for n = 1."""
    n, out = _group_size(cfg), {}
    for i, layer in enumerate(cfg.layer_attention):
        get_i = functools.partial(get, i)
        if layer.linear:
            mixer = {"linear_attention_norm": {"scale": get_i("input_layernorm.weight", (cfg.d_model,))}}
            mixer |= {"linear_attention": _linear_from_hf(get_i, cfg)}
            mixer |= {"ffn_norm": {"scale": get_i("post_attention_layernorm.weight", (cfg.d_model,))}}
        else:
            mixer = _attention_from_hf(get_i, cfg, to_pairs)
        if cfg.num_experts and (i + 1) % cfg.moe_every == 0:
            ffn = moe.moe_from_hf(get_i, cfg, "qwen2_moe")
        else:
            ffn = llama.ffn_from_hf(lambda name, s, get_i=get_i: get_i(f"mlp.{name}", s), cfg.d_model, cfg.d_ff)
        if n == 1:
            out[f"layers_{i}"] = mixer | {"ffn": ffn}
        else:
            out.setdefault(f"layers_{i // n}", {})[f"block_{i % n}"] = mixer | {"ffn": ffn}
    return out


def _layers_to_hf(dec: Mapping, cfg: ModelConfig) -> list[dict]:
    """Inverse of _layers_from_hf: HF layer i's tensors (names without `model.layers.i.`) for each i."""
    n, out = _group_size(cfg), []
    for i, layer in enumerate(cfg.layer_attention):
        p = dec[f"layers_{i}"] if n == 1 else dec[f"layers_{i // n}"][f"block_{i % n}"]
        if layer.linear:
            tensors = _linear_to_hf(p["linear_attention"], cfg)
            tensors["input_layernorm.weight"] = p["linear_attention_norm"]["scale"]
            tensors["post_attention_layernorm.weight"] = p["ffn_norm"]["scale"]
        else:
            tensors = _attention_to_hf(p, cfg)
        if cfg.num_experts and (i + 1) % cfg.moe_every == 0:
            tensors |= moe.moe_to_hf(p["ffn"], cfg, "qwen2_moe")
        else:
            tensors |= {f"mlp.{k}": v for k, v in llama.ffn_to_hf(p["ffn"]).items()}
        out.append(tensors)
    return out


def params_from_hf(tensors: Mapping[str, np.ndarray], cfg: ModelConfig) -> dict:
    """HF Qwen3-Next tensors -> DecoderLM params (float32, stacked when cfg.scan_layers), the multi-token-prediction
    weights (mtp.*) left out; a missing, extra or misshapen tensor is a ValueError naming it."""
    tensors = {name: t for name, t in tensors.items() if not name.startswith("mtp.")}
    return llama.params_from_hf(tensors, cfg, layers=_layers_from_hf)


def params_to_hf(params: Mapping, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """DecoderLM params -> HF tensors named as Qwen3NextForCausalLM.save_pretrained names them."""
    return llama.params_to_hf(params, cfg, layers=_layers_to_hf)


# ----------------------------------------------------------------------------------------------------------------
# folders


def load_qwen3_next(folder) -> tuple[ModelConfig, dict]:
    """A save_pretrained Qwen3NextForCausalLM folder -> (ModelConfig, DecoderLM params as float32 numpy)."""
    return hf_folder.load_decoder_folder(folder, config_from_hf, params_from_hf)


_FOLDER = exportable.DecoderFolder(config_to_hf, config_from_hf, params_to_hf)
write_qwen3_next, save_qwen3_next = _FOLDER.write, _FOLDER.save
