"""Llama 4 text checkpoints (Hugging Face Llama4ForCausalLM, model_type llama4_text) <-> DecoderLM.

A Llama (txjax.convert.llama reads and writes its embeddings, attention, norms and RoPE's parameters) with:
    no_rope_layers (1: RoPE, 0: none, one per layer)   -> model.rope_layers (R / N per layer)
    attention_chunk_size on the RoPE layers             -> model.attention_chunk (read by those layers alone)
    attn_temperature_tuning's attn_scale, floor_scale   -> model.attention_temperature, attention_floor_scale (NoPE)
    use_qk_norm: the RoPE layers' q and k over their RMS, no gain -> model.qk_l2_norm
    MoE on layers step - 1, 2 step - 1, ... (interleave_moe_layer_step) -> model.moe_every = step; its router's top-k
    logits through a sigmoid scale the chosen experts' inputs: router 'sigmoid' (top-k of sigmoid(z) is the top-k of
    z; its bias, which Llama 4 has not, zero) with model.moe_gate_input; one shared expert of the experts' width
    (intermediate_size); the dense layers' FFN intermediate_size_mlp (model.d_ff).
RoPE layout: Llama 4 rotates adjacent pairs (channel 2i with 2i + 1, as complex numbers), txjax's own layout, so q
and k are read as they are (llama.params_from_hf's pairs_layout). Per layer, HF [out, in] weights transposed:
    feed_forward.router.weight [X, D]                 -> ffn.router.kernel [D, X]
    feed_forward.experts.gate_up_proj [X, D, 2F]      -> ffn.experts.wi (the first F: silu's), wi_gate [X, D, F]
    feed_forward.experts.down_proj [X, F, D]          -> ffn.experts.wo [X, F, D]
    feed_forward.shared_expert.{gate,up,down}_proj    -> ffn.shared_experts;  feed_forward.{gate,up,down}_proj: ffn
A config txjax cannot represent (moe_layers or layer_types off the pattern, attention biases) is a one-line ValueError
naming the config.json field.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping

import numpy as np

from txjax.convert import exportable, hf_folder, llama
from txjax.errors import ConfigError
from txjax.model.config import ModelConfig

MODEL_TYPES = ("llama4_text",)


def config_from_hf(hf: Mapping, has_head: bool) -> ModelConfig:
    """A Llama 4 text config.json (as a dict) -> ModelConfig; `has_head`: the weights hold lm_head.weight.
    Unrepresentable fields are a ValueError naming them."""
    if hf.get("model_type") not in MODEL_TYPES:
        raise ValueError(f"config.json: model_type={hf.get('model_type')!r} is not {MODEL_TYPES[0]!r}")
    hf_folder.integers(hf, "num_hidden_layers", "intermediate_size", "intermediate_size_mlp", "num_local_experts")
    layers, step = hf["num_hidden_layers"], hf.get("interleave_moe_layer_step", 1)
    if not isinstance(step, int) or step <= 0 or layers % step:
        raise ValueError(f"config.json: interleave_moe_layer_step={step!r} must divide num_hidden_layers={layers}")
    if hf.get("moe_layers") is not None and list(hf["moe_layers"]) != list(range(step - 1, layers, step)):
        raise ValueError(
            f"config.json: moe_layers={hf['moe_layers']!r} is not every interleave_moe_layer_step-th layer (txjax's "
            "MoE layers are: model.moe_every)"
        )
    interval = hf.get("no_rope_layer_interval", 4)
    flags = hf.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(layers)]
    chunk = hf.get("attention_chunk_size") or 0
    kinds = ["chunked_attention" if flag and chunk else "full_attention" for flag in flags]
    if hf.get("layer_types") is not None and list(hf["layer_types"]) != kinds:
        raise ValueError(
            f"config.json: layer_types={hf['layer_types']!r} must chunk the RoPE layers of no_rope_layers alone "
            "(txjax chunks its RoPE layers: model.attention_chunk)"
        )
    ropes = "".join("R" if flag else "N" for flag in flags)
    dense = {**hf, "model_type": "llama", "intermediate_size": hf["intermediate_size_mlp"]}
    tuned = hf.get("attn_temperature_tuning", True) and "N" in ropes  # the temperature of NoPE layers, if any
    return dataclasses.replace(
        llama.config_from_hf(dense, has_head),
        rope_layers="" if set(ropes) <= {"R"} else ropes,
        attention_chunk=chunk,
        attention_temperature=float(hf.get("attn_scale", 0.1)) if tuned else 0.0,
        attention_floor_scale=hf.get("floor_scale", 8192) if tuned else 8192,
        qk_l2_norm=bool(hf.get("use_qk_norm", True)),
        num_experts=hf["num_local_experts"],
        experts_per_token=hf.get("num_experts_per_tok", 1),
        num_shared_experts=1,
        moe_d_ff=hf["intermediate_size"],
        moe_every=step,
        router="sigmoid",
        moe_gate_input=True,
    )


def config_to_hf(cfg: ModelConfig, bos_id: int | None = None, eos_id: int | None = None) -> dict:
    """ModelConfig -> a config.json Llama4ForCausalLM loads; a field it cannot hold is refused when it is read back
    (exportable.check_fields)."""
    hf = llama.config_to_hf(dataclasses.replace(cfg, rope_layers="", attention_temperature=0.0), bos_id, eos_id)
    flags = [int(layer.rope) for layer in cfg.layer_attention]
    return hf | {
        "architectures": ["Llama4ForCausalLM"],
        "model_type": MODEL_TYPES[0],
        "intermediate_size": cfg.expert_d_ff,
        "intermediate_size_mlp": cfg.d_ff,
        "num_local_experts": cfg.num_experts,
        "num_experts_per_tok": cfg.experts_per_token,
        "interleave_moe_layer_step": cfg.moe_every,
        "moe_layers": list(range(cfg.moe_every - 1, cfg.num_layers, cfg.moe_every)),
        "no_rope_layers": flags,
        "attention_chunk_size": cfg.attention_chunk or None,
        "layer_types": ["chunked_attention" if flag and cfg.attention_chunk else "full_attention" for flag in flags],
        "attn_temperature_tuning": cfg.attention_temperature > 0,
        "attn_scale": cfg.attention_temperature,
        "floor_scale": cfg.attention_floor_scale,
        "use_qk_norm": cfg.qk_l2_norm,
        "output_router_logits": False,
        "pad_token_id": None,
    }


# ----------------------------------------------------------------------------------------------------------------
# tensors <-> params


def _moe_from_hf(get: Callable, cfg: ModelConfig) -> dict:
    """One MoE block's params (router with its zero bias, experts, the shared expert) from get(name, shape)."""
    d, x, f = cfg.d_model, cfg.num_experts, cfg.expert_d_ff
    gate_up = get("feed_forward.experts.gate_up_proj", (x, d, 2 * f))
    return {
        "router": {"kernel": get("feed_forward.router.weight", (x, d)).T},
        "router_bias": np.zeros(x, np.float32),
        "experts": {
            "wi": gate_up[..., :f],
            "wi_gate": gate_up[..., f:],
            "wo": get("feed_forward.experts.down_proj", (x, f, d)),
        },
        "shared_experts": llama.ffn_from_hf(lambda n, s: get(f"feed_forward.shared_expert.{n}", s), d, f),
    }


def _layers_from_hf(get: Callable, cfg: ModelConfig, to_pairs: np.ndarray) -> dict:
    """The decoder's layers (llama.params_from_hf's `layers`): HF layer i is MoE when (i + 1) % moe_every == 0, else
    dense; with moe_every = n > 1 layer i sits at layers_{i // n}.block_{i % n} (txjax.model.layers.Group)."""
    n, out = cfg.moe_every, {}
    for i in range(cfg.num_layers):
        get_i = functools.partial(get, i)
        if (i + 1) % n:
            ffn = llama.ffn_from_hf(lambda name, s, g=get_i: g(f"feed_forward.{name}", s), cfg.d_model, cfg.d_ff)
        else:
            ffn = _moe_from_hf(get_i, cfg)
        layer = llama.attention_from_hf(get_i, cfg, to_pairs) | {"ffn": ffn}
        if n == 1:
            out[f"layers_{i}"] = layer
        else:
            out.setdefault(f"layers_{i // n}", {})[f"block_{i % n}"] = layer
    return out


def _layers_to_hf(dec: Mapping, cfg: ModelConfig) -> list[dict]:
    """Inverse of _layers_from_hf: HF layer i's tensors (names without `model.layers.i.`) for each i; a router bias
    that is not zero has no place in Llama 4: a ConfigError."""
    n, out = cfg.moe_every, []
    for i in range(cfg.num_layers):
        p = dec[f"layers_{i}"] if n == 1 else dec[f"layers_{i // n}"][f"block_{i % n}"]
        tensors, ffn = llama.attention_to_hf(p, cfg, pairs_layout=True), p["ffn"]
        if (i + 1) % n:
            tensors |= {f"feed_forward.{k}": v for k, v in llama.ffn_to_hf(ffn).items()}
            out.append(tensors)
            continue
        if np.any(ffn["router_bias"]):  # trained by train.moe_bias_rate
            raise ConfigError(
                f"export to Llama4ForCausalLM cannot express layer {i}'s router bias (Llama 4's router has none): "
                f"{exportable.REFUSED}"
            )
        experts = ffn["experts"]
        tensors["feed_forward.router.weight"] = ffn["router"]["kernel"].T
        tensors["feed_forward.experts.gate_up_proj"] = np.concatenate([experts["wi"], experts["wi_gate"]], -1)
        tensors["feed_forward.experts.down_proj"] = experts["wo"]
        shared = llama.ffn_to_hf(ffn["shared_experts"])
        out.append(tensors | {f"feed_forward.shared_expert.{k}": v for k, v in shared.items()})
    return out


def params_from_hf(tensors: Mapping[str, np.ndarray], cfg: ModelConfig) -> dict:
    """HF Llama 4 text tensors -> DecoderLM params (float32, stacked when cfg.scan_layers); a missing, extra or
    misshapen tensor is a ValueError naming it."""
    return llama.params_from_hf(tensors, cfg, pairs_layout=True, layers=_layers_from_hf)


def params_to_hf(params: Mapping, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """DecoderLM params -> HF tensors named as Llama4ForCausalLM.save_pretrained names them."""
    return llama.params_to_hf(params, cfg, layers=_layers_to_hf)


# ----------------------------------------------------------------------------------------------------------------
# folders


def load_llama4(folder) -> tuple[ModelConfig, dict]:
    """A save_pretrained Llama4ForCausalLM folder -> (ModelConfig, DecoderLM params as float32 numpy)."""
    return hf_folder.load_decoder_folder(folder, config_from_hf, params_from_hf)


_FOLDER = exportable.DecoderFolder(config_to_hf, config_from_hf, params_to_hf)
write_llama4, save_llama4 = _FOLDER.write, _FOLDER.save
