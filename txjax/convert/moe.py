"""Mixture-of-experts checkpoints (Hugging Face MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM,
OlmoeForCausalLM, GptOssForCausalLM) <-> DecoderLM with model.num_experts > 0 (txjax.model.moe).

Each is a Llama-family model (txjax.convert.llama reads and writes its embeddings, attention, norms and RoPE's pair
layout) whose FFN is a mixture of experts. Per layer, HF [out, in] weights transposed, experts stacked in index order:

    Mixtral    block_sparse_moe.gate [X, D]                    -> ffn.router.kernel [D, X]
               block_sparse_moe.experts.e.w1, w3 [F, D], w2 [D, F] -> ffn.experts.wi, wi_gate [X, D, F], wo [X, F, D]
    Qwen2-MoE  mlp.gate, mlp.experts.e.gate_proj, up_proj, down_proj: as Mixtral's
               mlp.shared_expert.{gate,up,down}_proj [S, D], [S, D], [D, S] -> ffn.shared_experts (one FFN of width S:
               num_shared_experts = S / moe_intermediate_size); mlp.shared_expert_gate [1, D] -> ffn.shared_expert_gate
               [D, 1] (model.shared_expert_gate: sigmoid(x w_s) scales the shared experts); q/k/v biases
    Qwen3-MoE  as Qwen2-MoE without shared experts or biases, with q/k RMSNorm per head (model.qk_norm)
    OLMoE      as Qwen3-MoE, its q/k RMSNorm over the whole projection, gains [H K] and [G K] (qk_norm_all_heads)
    GPT-OSS    mlp.router.weight [X, D], bias [X] -> ffn.router.kernel [D, X], bias (model.moe_bias);
               mlp.experts.gate_up_proj [X, D, 2F] (gate and up interleaved: columns 2i, 2i+1), its bias [X, 2F]
               -> ffn.experts.wi, wi_gate [X, D, F] and their biases; down_proj [X, F, D], bias [X, D] -> wo, wo_bias
               (not transposed: its experts compute x W); the clamped SwiGLU (activation=swiglu_clamped); biases on
               q, k, v, o (attention_bias); self_attn.sinks [H] (attention_sinks); layer_types' sliding_attention
               layers local with sliding_window (window_pattern); YaRN with truncate false (rope_truncate). The
               bfloat16 folders transformers saves; the published MXFP4 ones (*_blocks, *_scales) are refused as extra
               tensors.

Routers: Mixtral's top-k of the softmax renormalised, i.e. a softmax over the top-k logits, is
router=topk_then_softmax; the others' softmax then top-k is router=softmax_then_topk, renormalised when
norm_topk_prob (moe_norm_topk). Qwen's decoder_sparse_step = n (layers n-1, 2n-1, ... MoE, the others a dense
mlp.{gate,up,down}_proj of intermediate_size) is model.moe_every = n, with the layers of group j at
decoder.layers_j.block_0 ... block_{n-1}; mlp_only_layers that make an MoE layer dense are refused.

Not imported (training settings, not the model): router_aux_loss_coef with output_router_logits, which turns HF's
balance loss on (it is k times txjax's per-layer balance loss, and taken over all layers' tokens at once, so there is
no exact weight; the run's train.moe_aux_weight keeps txjax's default, set it with --config.train.moe_aux_weight),
and Mixtral's router_jitter_noise (noise on the router's input while training). None of the four has a router bias.
A config txjax cannot represent (clip_qkv, a sparse step the layer count does not divide, a shared expert width that
is not a multiple of an expert's) is a one-line ValueError naming the config.json field.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from txjax.convert import exportable, hf_folder, llama
from txjax.model.activations import GPT_OSS_ALPHA, GPT_OSS_LIMIT
from txjax.model.config import ModelConfig

MODEL_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "gpt_oss")
_ARCHITECTURES = {
    "mixtral": "MixtralForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "olmoe": "OlmoeForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
}
_ATTENTION = {"mixtral": "mistral", "qwen2_moe": "qwen2", "qwen3_moe": "qwen3", "olmoe": "qwen3", "gpt_oss": "llama"}
# the MoE block's name and its experts' (gate, up, down) weight names
_BLOCKS = {"mixtral": ("block_sparse_moe", ("w1", "w3", "w2"))}
_BLOCKS |= dict.fromkeys(("qwen2_moe", "qwen3_moe", "olmoe"), ("mlp", llama.MLP_NAMES))


# ----------------------------------------------------------------------------------------------------------------
# config.json <-> ModelConfig


def _experts_and_step(hf: Mapping, kind: str) -> tuple[int, int]:
    """(routed experts, moe_every) of a config.json; a sparse pattern moe_every cannot express is a ValueError."""
    experts = hf.get("num_experts", hf.get("num_local_experts"))  # transformers 5 writes Qwen3-MoE's as the latter
    if not isinstance(experts, int) or experts <= 0:
        raise ValueError(f"config.json: num_experts={experts!r} must be a positive integer (a mixture of experts)")
    if kind in ("mixtral", "olmoe", "gpt_oss"):
        return experts, 1
    layers, step = hf["num_hidden_layers"], hf.get("decoder_sparse_step", 1)
    if not isinstance(step, int) or step <= 0 or layers % step:
        raise ValueError(
            f"config.json: decoder_sparse_step={step!r} must be a positive integer dividing num_hidden_layers={layers}"
            " (txjax's MoE layers are every n-th of whole groups: model.moe_every)"
        )
    dense = [i for i in hf.get("mlp_only_layers") or [] if (i + 1) % step == 0]
    if dense:
        raise ValueError(
            f"config.json: mlp_only_layers={hf['mlp_only_layers']!r} makes layer {dense[0]} dense, which txjax cannot "
            "represent (its MoE layers are every decoder_sparse_step-th: model.moe_every)"
        )
    return experts, step


def config_from_hf(hf: Mapping, has_head: bool) -> ModelConfig:
    """A Mixtral / Qwen2-MoE / Qwen3-MoE / OLMoE config.json (as a dict) -> ModelConfig; `has_head`: the weights hold
    lm_head.weight. Unrepresentable fields are a ValueError naming them."""
    kind = hf.get("model_type")
    if kind not in MODEL_TYPES:
        raise ValueError(f"config.json: model_type={kind!r} is not a mixture of experts ({', '.join(MODEL_TYPES)})")
    hf_folder.integers(hf, "num_hidden_layers", "num_experts_per_tok", "intermediate_size")
    if hf.get("clip_qkv") is not None:
        raise ValueError(f"config.json: clip_qkv={hf['clip_qkv']!r} is not supported (txjax does not clip q, k, v)")
    experts, step = _experts_and_step(hf, kind)
    qwen = kind in ("qwen2_moe", "qwen3_moe")
    if qwen:
        hf_folder.integers(hf, "moe_intermediate_size")
    width = hf["moe_intermediate_size"] if qwen else hf["intermediate_size"]
    shared = 0
    if kind == "qwen2_moe":
        hf_folder.integers(hf, "shared_expert_intermediate_size")
        shared, rest = divmod(hf["shared_expert_intermediate_size"], width)
        if shared <= 0 or rest:
            raise ValueError(
                f"config.json: shared_expert_intermediate_size={hf['shared_expert_intermediate_size']} must be a "
                f"positive multiple of moe_intermediate_size={width} (txjax's shared experts are n of that width)"
            )
    no_bias = kind == "qwen2_moe" and not hf.get("qkv_bias", True)  # transformers 5 lets Qwen2-MoE turn them off
    attention = "llama" if no_bias else _ATTENTION[kind]
    base = llama.config_from_hf({**hf, "model_type": attention}, has_head)
    mixtral = kind in ("mixtral", "gpt_oss")  # both a softmax over the top-k logits
    return dataclasses.replace(
        base,
        **(_gpt_oss_fields(hf) if kind == "gpt_oss" else {}),
        num_experts=experts,
        experts_per_token=hf["num_experts_per_tok"],
        num_shared_experts=shared,
        shared_expert_gate=shared > 0,
        moe_d_ff=width if qwen else None,
        moe_every=step,
        router="topk_then_softmax" if mixtral else "softmax_then_topk",
        moe_norm_topk=False if mixtral else bool(hf.get("norm_topk_prob", False)),
        qk_norm_all_heads=kind == "olmoe",
    )


def _gpt_oss_fields(hf: Mapping) -> dict:
    """ModelConfig's fields of what GPT-OSS adds to a Llama attention and a Mixtral router (the module docstring);
    another SwiGLU clamp, or a layer type other than sliding and full attention, is a ValueError naming it."""
    for name, want in (("swiglu_alpha", GPT_OSS_ALPHA), ("swiglu_limit", GPT_OSS_LIMIT)):
        if hf.get(name, want) != want:
            raise ValueError(f"config.json: {name}={hf[name]!r} is not supported (txjax's swiglu_clamped has {want})")
    layers = hf["num_hidden_layers"]
    types = hf.get("layer_types") or ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    if set(types) - {"sliding_attention", "full_attention"}:
        raise ValueError(f"config.json: layer_types={types!r} must be sliding_attention or full_attention each")
    pattern, window = "".join("L" if t == "sliding_attention" else "G" for t in types), hf.get("sliding_window") or 0
    local = {"attention_window": window, "window_pattern": "" if set(pattern) == {"L"} else pattern}
    fields = {"activation": "swiglu_clamped", "moe_bias": True, "attention_sinks": True}
    fields["attention_bias"] = bool(hf.get("attention_bias", True))
    return fields | (local if window and "L" in pattern else {})


def _kind(cfg: ModelConfig) -> str:
    """The Hugging Face architecture of an MoE ModelConfig, or a ValueError naming the field none of them has."""
    if cfg.router == "sigmoid" or cfg.num_experts == 0:
        field = "router" if cfg.num_experts else "num_experts"
        raise ValueError(f"model.{field}={getattr(cfg, field)!r} has no Hugging Face MoE architecture txjax writes")
    kind = "olmoe" if cfg.qk_norm_all_heads else "qwen3_moe" if cfg.qk_norm else "qwen2_moe"
    if not (cfg.qk_norm or cfg.num_shared_experts or cfg.qkv_bias):
        kind = "gpt_oss" if cfg.moe_bias else "mixtral"
    # each architecture's fixed features: (field, the value it needs)
    needs = {
        "mixtral": [("moe_every", 1)],
        "qwen2_moe": [("shared_expert_gate", True), ("attention_window", 0)],
        "qwen3_moe": [("num_shared_experts", 0), ("qkv_bias", False), ("attention_window", 0)],
        "olmoe": [("num_shared_experts", 0), ("qkv_bias", False), ("attention_window", 0), ("moe_every", 1)],
        "gpt_oss": [("moe_every", 1), ("router", "topk_then_softmax"), ("activation", "swiglu_clamped")],
    }[kind]
    if kind == "mixtral" and cfg.router == "softmax_then_topk" and not cfg.moe_norm_topk:
        needs.append(("moe_norm_topk", True))  # renormalised, softmax-then-top-k is Mixtral's softmax over the top k
    if kind == "olmoe" and cfg.head_dim * cfg.num_heads != cfg.d_model:
        raise ValueError(
            f"model.d_head={cfg.d_head} cannot be exported to olmoe (its q_norm spans d_model = heads x d_head)"
        )
    for name, want in needs:
        if getattr(cfg, name) != want:
            raise ValueError(f"model.{name}={getattr(cfg, name)!r} cannot be exported to {kind} (needs {want!r})")
    return kind


def config_to_hf(cfg: ModelConfig, bos_id: int | None = None, eos_id: int | None = None) -> dict:
    """MoE ModelConfig -> a config.json of the architecture its features name (OLMoE with qk_norm_all_heads, Qwen3-MoE
    with per-head q/k norms, Qwen2-MoE with shared experts or q/k/v biases, else Mixtral)."""
    kind = _kind(cfg)
    if kind == "gpt_oss":
        return _gpt_oss_config(cfg, bos_id, eos_id)
    hf = llama.config_to_hf(cfg, bos_id, eos_id)  # the attention and norms; the MoE fields follow
    # a renormalised top-k of the softmax equals Mixtral's softmax over the top-k logits
    norm = cfg.moe_norm_topk or cfg.router == "topk_then_softmax"
    hf |= {"architectures": [_ARCHITECTURES[kind]], "model_type": kind, "num_experts_per_tok": cfg.experts_per_token}
    hf |= {"num_local_experts" if kind == "mixtral" else "num_experts": cfg.num_experts}
    if kind in ("mixtral", "olmoe"):
        hf["intermediate_size"] = cfg.expert_d_ff
    if kind != "mixtral":
        hf |= {"norm_topk_prob": norm, "output_router_logits": False}
    if kind in ("qwen2_moe", "qwen3_moe"):
        hf |= {"moe_intermediate_size": cfg.expert_d_ff, "decoder_sparse_step": cfg.moe_every, "mlp_only_layers": []}
    if kind == "qwen2_moe":
        hf |= {"qkv_bias": cfg.qkv_bias, "shared_expert_intermediate_size": cfg.num_shared_experts * cfg.expert_d_ff}
    return hf


def _gpt_oss_config(cfg: ModelConfig, bos_id, eos_id) -> dict:
    """An MoE ModelConfig with model.moe_bias -> GPT-OSS's config.json (what it cannot hold is refused on reading
    it back: exportable.checked)."""
    plain = dataclasses.replace(cfg, attention_window=0, window_pattern="", attention_bias=False)
    return llama.config_to_hf(plain, bos_id, eos_id) | {
        "architectures": [_ARCHITECTURES["gpt_oss"]],
        "model_type": "gpt_oss",
        "num_local_experts": cfg.num_experts,
        "num_experts_per_tok": cfg.experts_per_token,
        "intermediate_size": cfg.expert_d_ff,
        "attention_bias": cfg.attention_bias,
        "sliding_window": cfg.attention_window or None,
        "layer_types": ["sliding_attention" if w else "full_attention" for w in cfg.layer_windows],
        "swiglu_alpha": GPT_OSS_ALPHA,
        "swiglu_limit": GPT_OSS_LIMIT,
        "output_router_logits": False,
    }


# ----------------------------------------------------------------------------------------------------------------
# tensors <-> params


def _interleave(a, b):
    """Columns a_0, b_0, a_1, b_1, ... of two [..., F] arrays (GPT-OSS's gate_up layout), NumPy or traced."""
    xp = jnp if isinstance(a, jax.core.Tracer) else np
    return xp.stack([a, b], axis=-1).reshape(*a.shape[:-1], 2 * a.shape[-1])


def _gpt_oss_from_hf(get: Callable, cfg: ModelConfig) -> dict:
    """One GPT-OSS MoE block's params (the module docstring's table)."""
    d, x, f = cfg.d_model, cfg.num_experts, cfg.expert_d_ff
    gate_up, gate_up_bias = (
        get("mlp.experts.gate_up_proj", (x, d, 2 * f)),
        get("mlp.experts.gate_up_proj_bias", (x, 2 * f)),
    )
    experts = {"wi": gate_up[..., ::2], "wi_gate": gate_up[..., 1::2], "wo": get("mlp.experts.down_proj", (x, f, d))}
    experts |= {"wi_bias": gate_up_bias[:, ::2], "wi_gate_bias": gate_up_bias[:, 1::2]}
    experts["wo_bias"] = get("mlp.experts.down_proj_bias", (x, d))
    router = {"kernel": get("mlp.router.weight", (x, d)).T, "bias": get("mlp.router.bias", (x,))}
    return {"router": router, "experts": experts}


def _gpt_oss_to_hf(ffn: Mapping) -> dict:
    """Inverse of _gpt_oss_from_hf: {name: array} without `model.layers.i.`."""
    e = ffn["experts"]
    return {
        "mlp.router.weight": ffn["router"]["kernel"].T,
        "mlp.router.bias": ffn["router"]["bias"],
        "mlp.experts.gate_up_proj": _interleave(e["wi"], e["wi_gate"]),
        "mlp.experts.gate_up_proj_bias": _interleave(e["wi_bias"], e["wi_gate_bias"]),
        "mlp.experts.down_proj": e["wo"],
        "mlp.experts.down_proj_bias": e["wo_bias"],
    }


def stack_experts(arrays: list):
    """np.stack of the experts' weights, or jnp.stack in check_headers' abstract pass (tracers)."""
    return jnp.stack(arrays) if isinstance(arrays[0], jax.core.Tracer) else np.stack(arrays)


def moe_from_hf(get: Callable, cfg: ModelConfig, kind: str) -> dict:
    """One MoE block's params (ffn.router, experts, shared experts and their gate) from get(name, shape)."""
    if kind == "gpt_oss":
        return _gpt_oss_from_hf(get, cfg)
    d, x, f = cfg.d_model, cfg.num_experts, cfg.expert_d_ff
    block, names = _BLOCKS[kind]
    each = [llama.ffn_from_hf(lambda n, s, e=e: get(f"{block}.experts.{e}.{n}", s), d, f, names) for e in range(x)]
    ffn = {
        "router": {"kernel": get(f"{block}.gate.weight", (x, d)).T},
        "experts": {key: stack_experts([p[key]["kernel"] for p in each]) for key in ("wi", "wi_gate", "wo")},
    }
    if cfg.num_shared_experts:
        width = cfg.num_shared_experts * f
        ffn["shared_experts"] = llama.ffn_from_hf(lambda n, s: get(f"mlp.shared_expert.{n}", s), d, width)
    if cfg.shared_expert_gate:
        ffn["shared_expert_gate"] = {"kernel": get("mlp.shared_expert_gate.weight", (1, d)).T}
    return ffn


def _layers_from_hf(get: Callable, cfg: ModelConfig, to_pairs: np.ndarray, kind: str) -> dict:
    """The decoder's layers (llama.params_from_hf's `layers`): HF layer i is MoE when (i + 1) % moe_every == 0, else
    a dense mlp; with moe_every = n > 1 layer i sits at layers_{i // n}.block_{i % n} (txjax.model.layers.Group)."""
    n, out = cfg.moe_every, {}
    for i in range(cfg.num_layers):
        get_i = functools.partial(get, i)
        if (i + 1) % n:
            ffn = llama.ffn_from_hf(lambda name, s, get_i=get_i: get_i(f"mlp.{name}", s), cfg.d_model, cfg.d_ff)
        else:
            ffn = moe_from_hf(get_i, cfg, kind)
        layer = llama.attention_from_hf(get_i, cfg, to_pairs) | {"ffn": ffn}
        if n == 1:
            out[f"layers_{i}"] = layer
        else:
            out.setdefault(f"layers_{i // n}", {})[f"block_{i % n}"] = layer
    return out


def _layers_to_hf(dec: Mapping, cfg: ModelConfig, kind: str) -> list[dict]:
    """Inverse of _layers_from_hf: HF layer i's tensors (names without `model.layers.i.`) for each i."""
    n, out = cfg.moe_every, []
    for i in range(cfg.num_layers):
        p = dec[f"layers_{i}"] if n == 1 else dec[f"layers_{i // n}"][f"block_{i % n}"]
        tensors, ffn = llama.attention_to_hf(p, cfg), p["ffn"]
        if (i + 1) % n:
            tensors |= {f"mlp.{k}": v for k, v in llama.ffn_to_hf(ffn).items()}
        else:
            tensors |= moe_to_hf(ffn, cfg, kind)
        out.append(tensors)
    return out


def moe_to_hf(ffn: Mapping, cfg: ModelConfig, kind: str) -> dict:
    """Inverse of moe_from_hf: one MoE block's tensors (names without `model.layers.i.`)."""
    if kind == "gpt_oss":
        return _gpt_oss_to_hf(ffn)
    (block, names), tensors = _BLOCKS[kind], {}
    tensors[f"{block}.gate.weight"] = ffn["router"]["kernel"].T
    for e in range(cfg.num_experts):
        expert = {key: {"kernel": ffn["experts"][key][e]} for key in ("wi", "wi_gate", "wo")}
        tensors |= {f"{block}.experts.{e}.{k}": v for k, v in llama.ffn_to_hf(expert, names).items()}
    if cfg.num_shared_experts:
        tensors |= {f"mlp.shared_expert.{k}": v for k, v in llama.ffn_to_hf(ffn["shared_experts"]).items()}
    if cfg.shared_expert_gate:
        tensors["mlp.shared_expert_gate.weight"] = ffn["shared_expert_gate"]["kernel"].T
    return tensors


def params_from_hf(tensors: Mapping[str, np.ndarray], cfg: ModelConfig, kind: str) -> dict:
    """HF tensors of a `kind` model -> DecoderLM params (float32, stacked when cfg.scan_layers); a missing, extra or
    misshapen tensor is a ValueError naming it."""
    layers = functools.partial(_layers_from_hf, kind=kind)
    return llama.params_from_hf(tensors, cfg, layers=layers)


def params_to_hf(params: Mapping, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """DecoderLM params -> HF tensors named as the architecture of cfg (`_kind`) names them in save_pretrained."""
    return llama.params_to_hf(params, cfg, layers=functools.partial(_layers_to_hf, kind=_kind(cfg)))


# ----------------------------------------------------------------------------------------------------------------
# folders


def load_moe(folder) -> tuple[ModelConfig, dict]:
    """A save_pretrained Mixtral / Qwen2-MoE / Qwen3-MoE / OLMoE folder -> (ModelConfig, params as float32 numpy)."""
    kind = hf_folder.read_config(Path(folder).expanduser())["model_type"]
    return hf_folder.load_decoder_folder(folder, config_from_hf, functools.partial(params_from_hf, kind=kind))


_FOLDER = exportable.DecoderFolder(config_to_hf, config_from_hf, params_to_hf)
write_moe, save_moe = _FOLDER.write, _FOLDER.save
