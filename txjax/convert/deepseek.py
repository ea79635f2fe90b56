"""DeepSeek-V3 checkpoints (Hugging Face DeepseekV3ForCausalLM) <-> DecoderLM with multi-head latent attention.

DeepSeek-V3's blocks are Llama's (pre-RMSNorm, SwiGLU, a final RMSNorm; txjax.convert.llama) with MLA
(model.attention=mla, txjax.model.latent) for attention; Hugging Face Linear weights are [out, in]:

    self_attn.q_proj [H*(n+R), D]  (q_lora_rank None)      -> q [D, H, R+n]
    self_attn.q_a_proj [Q, D], q_a_layernorm, q_b_proj [H*(n+R), Q] -> q_down [D, Q], q_norm, q_up [Q, H, R+n]
    self_attn.kv_a_proj_with_mqa [C+R, D], kv_a_layernorm   -> kv_down [D, C+R], kv_norm
    self_attn.kv_b_proj [H*(n+v), C]                        -> key_up [C, H, n], value_up [C, H, v]
    self_attn.o_proj [D, H*v]                               -> out [H, v, D]

A head's channels are [nope ; rope] there and [rope ; nope] here (no dot product sees the order); the RoPE channels
keep their pairs with rope_interleave (transformers' default: pairs (2i, 2i+1), txjax's) and are permuted from
rotate_half's layout without it (llama.pairs). YaRN's mscale_all_dim is model.rope_mscale_all_dim, and its mscale
the attention factor it implies.

The MoE layers (those from first_k_dense_replace on) are txjax.model.moe's with router=sigmoid: mlp.gate.weight
[X, D] and its e_score_correction_bias -> ffn.router.kernel [D, X] and ffn.router_bias, mlp.experts.e.{gate,up,
down}_proj -> ffn.experts [X, ...], mlp.shared_experts (n_shared_experts x moe_intermediate_size wide) ->
ffn.shared_experts; n_group / topk_group -> model.moe_groups / moe_topk_groups, routed_scaling_factor ->
model.moe_routed_scale, norm_topk_prob -> model.moe_norm_topk, first_k_dense_replace -> model.moe_dense_first (the
model dense when it is >= num_hidden_layers); any field txjax cannot hold is refused in one line.

Multi-token prediction: the num_nextn_predict_layers layers after the decoder's, model.layers.{L + k - 1}. (L the
decoder's layers; transformers' DeepseekV3ForCausalLM skips them), are model.mtp_depth's modules (txjax.model.mtp),
read when the checkpoint holds them (mtp_depth 0 when it does not) and written back: enorm, hnorm, eh_proj [D, 2D]
-> mtp.depth_k's embed_norm, hidden_norm, proj [2D, D]; the decoder layer (MoE when the model has experts) -> block;
shared_head.norm -> head_norm. Their embed_tokens and shared_head.head are the model's own (txjax shares them; an
import whose copies differ is refused).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from txjax.convert import exportable, hf_folder, llama, moe
from txjax.model import moe_config
from txjax.model.config import ModelConfig

MODEL_TYPES = ("deepseek_v3",)
_LATENT_EPS = 1e-6  # transformers' q_a_layernorm and kv_a_layernorm: DeepseekV3RMSNorm's default eps


def _mscale(factor: float, m: float) -> float:
    """YaRN's mscale, 0.1 m ln(factor) + 1 (1 for factor <= 1): transformers' yarn_get_mscale."""
    return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0


def config_from_hf(hf: Mapping, has_head: bool, mtp: bool = False) -> ModelConfig:
    """A DeepSeek-V3 config.json (as a dict) -> ModelConfig; a field txjax cannot hold is a ValueError naming it.
    mtp: whether the checkpoint holds the MTP layers (else mtp_depth 0, whatever num_nextn_predict_layers says)."""
    if hf.get("model_type") not in MODEL_TYPES:
        raise ValueError(f"config.json: model_type={hf.get('model_type')!r} is not {', '.join(MODEL_TYPES)}")
    sizes = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
    hf_folder.integers(hf, *sizes, "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
    layers = hf["num_hidden_layers"]
    unsupported = {
        "hidden_act": ("silu", "txjax's SwiGLU gates with silu"),
        "attention_bias": (False, "txjax's MLA has no biases"),
        "rms_norm_eps": (_LATENT_EPS, "the latent norms' eps is 1e-6 and txjax's MLA shares the model's"),
    }
    for name, (want, why) in unsupported.items():
        if hf.get(name, want) != want:
            raise ValueError(f"config.json: {name}={hf[name]!r} is not supported ({why})")
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    mscale, mscale_all_dim = rope.pop("mscale", None), rope.pop("mscale_all_dim", None)
    if rope.get("rope_type", rope.get("type")) == "yarn" and rope.get("attention_factor") is None:
        if mscale and mscale_all_dim:  # transformers' _compute_yarn_parameters
            rope["attention_factor"] = _mscale(rope["factor"], mscale) / _mscale(rope["factor"], mscale_all_dim)
    fields = llama._rope({**hf, "rope_parameters": rope, "rope_scaling": None}) | _experts(hf)
    return ModelConfig(
        vocab_size=hf["vocab_size"],
        d_model=hf["hidden_size"],
        num_heads=hf["num_attention_heads"],
        d_ff=hf["intermediate_size"],
        num_layers=layers,
        max_len=hf.get("max_position_embeddings", 4096),
        attention="mla",
        q_lora_rank=hf.get("q_lora_rank") or 0,
        kv_lora_rank=hf["kv_lora_rank"],
        qk_nope_head_dim=hf["qk_nope_head_dim"],
        qk_rope_head_dim=hf["qk_rope_head_dim"],
        v_head_dim=hf["v_head_dim"],
        rope_mscale_all_dim=float(mscale_all_dim or 0.0) if fields.get("rope_scaling") == "yarn" else 0.0,
        mtp_depth=hf.get("num_nextn_predict_layers", 0) if mtp else 0,
        tie_embeddings=hf.get("tie_word_embeddings", not has_head),
        norm_eps=float(hf.get("rms_norm_eps", _LATENT_EPS)),
        **fields,
        init_std=hf.get("initializer_range", 0.02),
        attention_dropout=hf.get("attention_dropout", 0.0),
        dropout=0.0,
        **llama._LLAMA_FIELDS,
    )


def _experts(hf: Mapping) -> dict:
    """ModelConfig's MoE fields of DeepSeek-V3's layers from first_k_dense_replace on ({}: every layer dense)."""
    layers, dense = hf["num_hidden_layers"], hf.get("first_k_dense_replace", 0)
    if not isinstance(dense, int) or dense < 0:
        raise ValueError(f"config.json: first_k_dense_replace={dense!r} must be an integer >= 0")
    if dense >= layers:
        return {}
    hf_folder.integers(hf, "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size", "n_group")
    return dict(
        num_experts=hf["n_routed_experts"],
        experts_per_token=hf["num_experts_per_tok"],
        num_shared_experts=hf.get("n_shared_experts") or 0,
        moe_d_ff=hf["moe_intermediate_size"],
        moe_dense_first=dense,
        router="sigmoid",
        moe_norm_topk=bool(hf.get("norm_topk_prob", True)),
        moe_groups=hf["n_group"],
        moe_topk_groups=hf.get("topk_group") or 1,
        moe_routed_scale=float(hf.get("routed_scaling_factor", 1.0)),
    )


def config_to_hf(cfg: ModelConfig, bos_id: int | None = None, eos_id: int | None = None) -> dict:
    """ModelConfig -> a config.json that DeepseekV3ForCausalLM loads; what it cannot hold (MoE layers other than all
    from the first on) is refused when read back (exportable.check_fields)."""
    rope = llama._rope_to_hf(cfg)
    if cfg.rope_mscale_all_dim:  # without mscale, transformers' attention factor is the one written or txjax's
        rope["mscale_all_dim"] = cfg.rope_mscale_all_dim
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.d_ff,
        "num_hidden_layers": cfg.num_layers,
        "num_nextn_predict_layers": cfg.mtp_depth,
        "first_k_dense_replace": next((i for i in range(cfg.num_layers) if moe_config.is_moe(cfg, i)), cfg.num_layers),
        "n_routed_experts": cfg.num_experts or 1,
        "num_experts_per_tok": cfg.experts_per_token,
        "n_shared_experts": cfg.num_shared_experts,
        "moe_intermediate_size": cfg.expert_d_ff,
        "n_group": cfg.moe_groups,
        "topk_group": cfg.moe_topk_groups,
        "norm_topk_prob": cfg.moe_norm_topk,
        "routed_scaling_factor": cfg.moe_routed_scale,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_heads,
        "q_lora_rank": cfg.q_lora_rank or None,
        "kv_lora_rank": cfg.kv_lora_rank,
        "qk_nope_head_dim": cfg.qk_nope_head_dim,
        "qk_rope_head_dim": cfg.qk_rope_head_dim,
        "v_head_dim": cfg.v_head_dim,
        "rope_interleave": True,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_len,
        "rms_norm_eps": cfg.norm_eps,
        "rope_parameters": rope,
        "tie_word_embeddings": cfg.tie_embeddings,
        "initializer_range": cfg.init_std,
        "attention_dropout": cfg.attention_dropout,
        "attention_bias": False,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "dtype": "float32",
        "use_cache": True,
    }


def _head_order(cfg: ModelConfig, interleave: bool) -> np.ndarray:
    """Our head channel c is HF's head channel ORDER[c]: [rope (in pairs) ; nope] from HF's [nope ; rope]."""
    n, r = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim
    return np.concatenate([n + (np.arange(r) if interleave else llama.pairs(r)), np.arange(n)])


def latent_from_hf(get: Callable, cfg: ModelConfig, interleave: bool = True) -> dict:
    """One block's MLA and its two norms from `get(name, shape)` (HF tensor `model.layers.i.<name>`)."""
    d, h, c, r = cfg.d_model, cfg.num_heads, cfg.kv_lora_rank, cfg.qk_rope_head_dim
    k, n, v, order = cfg.qk_head_dim, cfg.qk_nope_head_dim, cfg.v_head_dim, _head_order(cfg, interleave)
    heads = lambda w, fan_in: w.T.reshape(fan_in, h, k)[..., order]
    attn = {}
    if cfg.q_lora_rank:
        q = cfg.q_lora_rank
        attn["q_down"] = get("self_attn.q_a_proj.weight", (q, d)).T
        attn["q_norm"] = {"scale": get("self_attn.q_a_layernorm.weight", (q,))}
        attn["q_up"] = heads(get("self_attn.q_b_proj.weight", (h * k, q)), q)
    else:
        attn["q"] = heads(get("self_attn.q_proj.weight", (h * k, d)), d)
    down = get("self_attn.kv_a_proj_with_mqa.weight", (c + r, d)).T
    attn["kv_down"] = down[:, np.concatenate([np.arange(c), c + order[:r] - n])]
    attn["kv_norm"] = {"scale": get("self_attn.kv_a_layernorm.weight", (c,))}
    up = get("self_attn.kv_b_proj.weight", (h * (n + v), c)).T.reshape(c, h, n + v)
    attn["key_up"], attn["value_up"] = up[..., :n], up[..., n:]
    attn["out"] = get("self_attn.o_proj.weight", (d, h * v)).T.reshape(h, v, d)
    norm = lambda name: {"scale": get(f"{name}.weight", (d,))}
    norms = {"self_attention_norm": norm("input_layernorm"), "ffn_norm": norm("post_attention_layernorm")}
    return norms | {"self_attention": attn}


def latent_to_hf(p: Mapping, cfg: ModelConfig) -> dict:
    """Inverse of latent_from_hf (rope_interleave): one block's tensors without `model.layers.i.`."""
    d, c = cfg.d_model, cfg.kv_lora_rank
    back = np.argsort(_head_order(cfg, True))
    a = p["self_attention"]
    flat = lambda w: w[..., back].reshape(w.shape[0], -1).T
    out = {"self_attn.q_proj.weight": flat(a["q"])} if "q" in a else {
        "self_attn.q_a_proj.weight": a["q_down"].T,
        "self_attn.q_a_layernorm.weight": a["q_norm"]["scale"],
        "self_attn.q_b_proj.weight": flat(a["q_up"]),
    }  # fmt: skip
    up = np.concatenate([a["key_up"], a["value_up"]], axis=-1)  # [C, H, n + v]
    return out | {
        "self_attn.kv_a_proj_with_mqa.weight": a["kv_down"].T,
        "self_attn.kv_a_layernorm.weight": a["kv_norm"]["scale"],
        "self_attn.kv_b_proj.weight": up.reshape(c, -1).T,
        "self_attn.o_proj.weight": a["out"].reshape(-1, d).T,
        "input_layernorm.weight": p["self_attention_norm"]["scale"],
        "post_attention_layernorm.weight": p["ffn_norm"]["scale"],
    }


def _moe_from_hf(get: Callable, cfg: ModelConfig) -> dict:
    """An MoE layer's FFN: mlp.gate.weight [X, D] and e_score_correction_bias [X] -> ffn.router.kernel [D, X] and
    ffn.router_bias; mlp.experts.e.{gate,up,down}_proj -> ffn.experts [X, ...]; mlp.shared_experts -> shared_experts."""
    d, x, f = cfg.d_model, cfg.num_experts, cfg.expert_d_ff
    each = [llama.ffn_from_hf(lambda n, s, e=e: get(f"mlp.experts.{e}.{n}", s), d, f) for e in range(x)]
    ffn = {
        "router": {"kernel": get("mlp.gate.weight", (x, d)).T},
        "router_bias": get("mlp.gate.e_score_correction_bias", (x,)),
        "experts": {key: moe.stack_experts([p[key]["kernel"] for p in each]) for key in ("wi", "wi_gate", "wo")},
    }
    if cfg.num_shared_experts:
        width = cfg.num_shared_experts * f
        ffn["shared_experts"] = llama.ffn_from_hf(lambda n, s: get(f"mlp.shared_experts.{n}", s), d, width)
    return ffn


def _moe_to_hf(ffn: Mapping, cfg: ModelConfig) -> dict:
    """Inverse of _moe_from_hf: {name without `model.layers.i.`: array}."""
    out = {"mlp.gate.weight": ffn["router"]["kernel"].T, "mlp.gate.e_score_correction_bias": ffn["router_bias"]}
    for e in range(cfg.num_experts):
        expert = {key: {"kernel": ffn["experts"][key][e]} for key in ("wi", "wi_gate", "wo")}
        out |= {f"mlp.experts.{e}.{k}": v for k, v in llama.ffn_to_hf(expert).items()}
    if cfg.num_shared_experts:
        out |= {f"mlp.shared_experts.{k}": v for k, v in llama.ffn_to_hf(ffn["shared_experts"]).items()}
    return out


def _where(cfg: ModelConfig, i: int) -> tuple[str, ...]:
    """Layer i's place in the looped decoder: dense_layers_i among the first moe_dense_first, else from j = i minus
    them layers_j, or layers_{j // n}.block_{j % n} in Groups of moe_every (txjax.model.models.Stack)."""
    n, j = cfg.moe_every if cfg.num_experts else 1, i - cfg.moe_dense_first
    return (f"dense_layers_{i}",) if j < 0 else (f"layers_{j}",) if n == 1 else (f"layers_{j // n}", f"block_{j % n}")


def _layer_from_hf(get: Callable, cfg: ModelConfig, moe: bool, interleave: bool) -> dict:
    """An HF layer (`get(name, shape)` of `model.layers.i.<name>`): MLA, norms, and a dense or (moe) MoE FFN."""
    dense = lambda: llama.ffn_from_hf(lambda n, s: get(f"mlp.{n}", s), cfg.d_model, cfg.d_ff)
    return latent_from_hf(get, cfg, interleave) | {"ffn": _moe_from_hf(get, cfg) if moe else dense()}


def _layer_to_hf(p: Mapping, cfg: ModelConfig, moe: bool) -> dict:
    """Inverse of _layer_from_hf."""
    dense = lambda: {f"mlp.{k}": v for k, v in llama.ffn_to_hf(p["ffn"]).items()}
    return latent_to_hf(p, cfg) | (_moe_to_hf(p["ffn"], cfg) if moe else dense())


def _mtp_from_hf(get: Callable, cfg: ModelConfig, params: Mapping, interleave: bool) -> dict:
    """{'mtp': the MTP modules} from the layers after the decoder's (`get(name, shape)` of `model.<name>`); {}
    without them."""
    d, v, embed = cfg.d_model, cfg.vocab_size, params["embed"]
    shared = {"embed_tokens": embed["tokens"]["embedding"]}
    shared["shared_head.head"] = shared["embed_tokens"] if cfg.tie_embeddings else embed["lm_head"]["kernel"].T
    depths = {}
    for k in range(1, cfg.mtp_depth + 1):
        i = cfg.num_layers + k - 1
        at = lambda name, shape, i=i: get(f"layers.{i}.{name}", shape)
        for name, own in shared.items():
            if not hf_folder.same(at(f"{name}.weight", (v, d)), own):
                raise ValueError(
                    f"{hf_folder.WEIGHTS_FILE}: model.layers.{i}.{name}.weight differs from the model's own; txjax's "
                    "multi-token prediction shares the embedding and the head"
                )
        depths[f"depth_{k}"] = {
            "embed_norm": {"scale": at("enorm.weight", (d,))},
            "hidden_norm": {"scale": at("hnorm.weight", (d,))},
            "proj": {"kernel": at("eh_proj.weight", (d, 2 * d)).T},
            "block": _layer_from_hf(at, cfg, cfg.num_experts > 0, interleave),
            "head_norm": {"scale": at("shared_head.norm.weight", (d,))},
        }
    return {"mtp": depths} if depths else {}


def _mtp_to_hf(params: Mapping, cfg: ModelConfig, out: Mapping) -> dict:
    """Inverse of _mtp_from_hf, with the model's embedding and head (`out`: its tensors) as the layers' copies."""
    embed = out["model.embed_tokens.weight"]
    tensors = {}
    for k in range(1, cfg.mtp_depth + 1):
        p = params["mtp"][f"depth_{k}"]
        layer = _layer_to_hf(p["block"], cfg, cfg.num_experts > 0) | {
            "enorm.weight": p["embed_norm"]["scale"],
            "hnorm.weight": p["hidden_norm"]["scale"],
            "eh_proj.weight": p["proj"]["kernel"].T,
            "shared_head.norm.weight": p["head_norm"]["scale"],
            "embed_tokens.weight": embed,
            "shared_head.head.weight": out.get("lm_head.weight", embed),
        }
        tensors |= {f"model.layers.{cfg.num_layers + k - 1}.{n}": np.ascontiguousarray(w) for n, w in layer.items()}
    return tensors


def params_from_hf(tensors: Mapping[str, np.ndarray], cfg: ModelConfig, interleave: bool = True) -> dict:
    """HF DeepSeek-V3 tensors -> DecoderLM params (llama.params_from_hf's embeddings, head and final norm)."""

    def layers(get, cfg_, _pairs):
        out = {}
        for i in range(cfg_.num_layers):
            *outer, last = _where(cfg_, i)
            tree = functools.reduce(lambda t, key: t.setdefault(key, {}), outer, out)
            tree[last] = _layer_from_hf(functools.partial(get, i), cfg_, moe_config.is_moe(cfg_, i), interleave)
        return out

    more = functools.partial(_mtp_from_hf, interleave=interleave)
    return llama.params_from_hf(tensors, cfg, layers=layers, more=more)


def params_to_hf(params: Mapping, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """DecoderLM params -> HF tensors as DeepseekV3ForCausalLM.save_pretrained names them (rope_interleave)."""
    at = lambda dec, i: functools.reduce(lambda t, key: t[key], _where(cfg, i), dec)
    layers = lambda dec, cfg_: [
        _layer_to_hf(at(dec, i), cfg_, moe_config.is_moe(cfg_, i)) for i in range(cfg_.num_layers)
    ]
    params = exportable.looped(params, cfg)
    out = llama.params_to_hf(params, cfg, layers=layers)
    return out | _mtp_to_hf(params, cfg, out)


def load_deepseek(folder) -> tuple[ModelConfig, dict]:
    """A save_pretrained DeepSeek-V3 folder -> (ModelConfig, DecoderLM params as float32 numpy), with its MTP
    modules when its tensors hold the first one's (model.layers.{num_hidden_layers}.eh_proj.weight)."""
    hf = hf_folder.read_config(Path(folder))
    mtp = f"model.layers.{hf.get('num_hidden_layers')}.eh_proj.weight" in hf_folder.read_tensors(Path(folder))
    return hf_folder.load_decoder_folder(
        folder,
        functools.partial(config_from_hf, mtp=mtp),
        functools.partial(params_from_hf, interleave=hf.get("rope_interleave", True)),
    )


_FOLDER = exportable.DecoderFolder(config_to_hf, functools.partial(config_from_hf, mtp=True), params_to_hf)
write_deepseek = _FOLDER.write  # the MTP layer's tensors read back too
