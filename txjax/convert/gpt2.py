"""GPT-2 checkpoints (a Hugging Face `save_pretrained` folder) <-> txjax DecoderLM parameters.

GPT-2 (Radford et al. 2019) is a DecoderLM with learned positions, pre-LN blocks and a final LayerNorm, a GELU(tanh)
FFN with biases and the LM head tied to the token embedding. Hugging Face stores its linear layers as Conv1D,
y = x W + b with W [in, out], so they become txjax kernels without a transpose:

    h.i.ln_1, h.i.ln_2, ln_f          -> self_attention_norm, ffn_norm, final_norm   (weight -> scale)
    h.i.attn.c_attn.weight [d, 3d]     =  [W^Q | W^K | W^V]; each [d, d] -> query/key/value [d, heads, d_k]
                                          (the columns are head-major: column h*d_k + j is head h, channel j)
    h.i.attn.c_proj.weight [d, d]     -> out [heads, d_k, d]
    h.i.mlp.c_fc / c_proj             -> ffn.wi [d, d_ff] / ffn.wo [d_ff, d]
    wte [vocab, d], wpe [n_positions, d] -> embed.tokens, embed.positions

The folder holds `config.json` and `model.safetensors` (or shards listed in `model.safetensors.index.json`),
read and written with the `safetensors` package; its tokenizer (vocab.json + merges.txt or tokenizer.json) becomes
a txjax `byte_bpe` tokenizer. Anything txjax cannot represent is a one-line ValueError that
names the field; writing goes to a temporary folder renamed into place, so a failure leaves nothing behind.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from txjax.convert import exportable, hf_folder
from txjax.data.tokenizers import ByteLevelBPETokenizer
from txjax.model.config import ModelConfig

# Hugging Face activation_function -> txjax activation (gelu_new is GPT-2's tanh approximation)
_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"}
_ACTIVATION_NAMES = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}
# ModelConfig fields that GPT-2 fixes; anything else cannot be exported
_GPT2_FIELDS = {
    "positional": "learned",
    "norm": "layernorm",
    "norm_placement": "pre",
    "use_bias": True,
    "tie_embeddings": True,
    "embed_scale": False,
    "qk_norm": False,
    "logit_softcap": 0.0,
    "parametrization": "standard",
}
# HF keys that are buffers, not parameters (the causal mask of old checkpoints)
_BUFFER_SUFFIXES = (".attn.bias", ".attn.masked_bias")


# ----------------------------------------------------------------------------------------------------------------
# config.json <-> ModelConfig


def config_from_hf(hf: Mapping) -> ModelConfig:
    """A GPT-2 config.json (as a dict) -> ModelConfig; a field txjax cannot represent is a ValueError naming it."""
    if hf.get("model_type") != "gpt2":
        raise ValueError(f"config.json: model_type={hf.get('model_type')!r}, not a GPT-2 checkpoint (expected 'gpt2')")
    hf_folder.integers(hf, "vocab_size", "n_positions", "n_embd", "n_layer", "n_head")
    act = hf.get("activation_function", "gelu_new")
    if act not in _ACTIVATIONS:
        raise ValueError(
            f"config.json: activation_function={act!r} is not supported (txjax has {', '.join(_ACTIVATIONS)})"
        )
    unsupported = {
        "tie_word_embeddings": (True, "txjax's GPT-2 head is tied to wte"),
        "add_cross_attention": (False, "no cross-attention in a DecoderLM"),
        "scale_attn_by_inverse_layer_idx": (False, "txjax scales every layer alike"),
    }
    for name, (want, why) in unsupported.items():
        if hf.get(name, want) != want:
            raise ValueError(f"config.json: {name}={hf[name]!r} is not supported ({why})")
    d = hf["n_embd"]
    return ModelConfig(
        vocab_size=hf["vocab_size"],
        d_model=d,
        num_heads=hf["n_head"],
        d_ff=hf.get("n_inner") or 4 * d,
        num_layers=hf["n_layer"],
        max_len=hf["n_positions"],
        activation=_ACTIVATIONS[act],
        norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        init_std=hf.get("initializer_range", 0.02),
        attention_scale="sqrt" if hf.get("scale_attn_weights", True) else "none",
        dropout=hf.get("resid_pdrop", 0.1),
        attention_dropout=hf.get("attn_pdrop", 0.1),
        **_GPT2_FIELDS,
    )


# GPT-2 small (124M parameters), the architecture of Hugging Face's "gpt2" config.json
GPT2_SMALL = config_from_hf(
    {"model_type": "gpt2", "vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12}
)


def config_to_hf(cfg: ModelConfig, bos_id: int | None = None, eos_id: int | None = None) -> dict:
    """ModelConfig -> a GPT-2 config.json dict that transformers' GPT2Config loads; an activation GPT-2 lacks is a
    ValueError, another field it cannot hold is refused when it is read back (exportable.check_fields)."""
    if cfg.activation not in _ACTIVATION_NAMES:
        raise ValueError(
            f"model.activation={cfg.activation!r} cannot be exported to GPT-2 "
            f"(needs one of {', '.join(_ACTIVATION_NAMES)})"
        )
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": cfg.vocab_size,
        "n_positions": cfg.max_len,
        "n_embd": cfg.d_model,
        "n_layer": cfg.num_layers,
        "n_head": cfg.num_heads,
        "n_inner": cfg.d_ff,
        "activation_function": _ACTIVATION_NAMES[cfg.activation],
        "layer_norm_epsilon": cfg.norm_eps,
        "initializer_range": cfg.init_std,
        "scale_attn_weights": cfg.attention_scale == "sqrt",
        "resid_pdrop": cfg.dropout,
        "embd_pdrop": cfg.dropout,
        "attn_pdrop": cfg.attention_dropout,
        "tie_word_embeddings": True,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "dtype": "float32",
        "use_cache": True,
    }


# ----------------------------------------------------------------------------------------------------------------
# tensors <-> params


def _layer_from_hf(get: Callable, cfg: ModelConfig) -> dict:
    """One block's params from `get(name, shape)`, which returns HF tensor `h.i.<name>` as float32 of that shape."""
    d, h, k, f = cfg.d_model, cfg.num_heads, cfg.head_dim, cfg.d_ff
    norm = lambda name: {"scale": get(f"{name}.weight", (d,)), "bias": get(f"{name}.bias", (d,))}
    w_qkv_Dx3D, b_qkv_3D = get("attn.c_attn.weight", (d, 3 * d)), get("attn.c_attn.bias", (3 * d,))
    attn = {}
    for j, name in enumerate(("query", "key", "value")):
        attn[name] = w_qkv_Dx3D[:, j * d : (j + 1) * d].reshape(d, h, k)
        attn[f"{name}_bias"] = b_qkv_3D[j * d : (j + 1) * d].reshape(h, k)
    attn["out"] = get("attn.c_proj.weight", (d, d)).reshape(h, k, d)
    attn["out_bias"] = get("attn.c_proj.bias", (d,))
    dense = lambda name, shape: {"kernel": get(f"{name}.weight", shape), "bias": get(f"{name}.bias", shape[1:])}
    return {
        "self_attention_norm": norm("ln_1"),
        "self_attention": attn,
        "ffn_norm": norm("ln_2"),
        "ffn": {"wi": dense("mlp.c_fc", (d, f)), "wo": dense("mlp.c_proj", (f, d))},
    }


def _layer_to_hf(p: Mapping, cfg: ModelConfig) -> dict:
    """Inverse of _layer_from_hf: one block's params -> {name: array} without the `h.i.` prefix."""
    d = cfg.d_model
    a = p["self_attention"]
    out = {
        "attn.c_attn.weight": np.concatenate([a[n].reshape(d, d) for n in ("query", "key", "value")], axis=1),
        "attn.c_attn.bias": np.concatenate([a[f"{n}_bias"].reshape(d) for n in ("query", "key", "value")]),
        "attn.c_proj.weight": a["out"].reshape(d, d),
        "attn.c_proj.bias": a["out_bias"],
    }
    for hf_name, name in (("ln_1", "self_attention_norm"), ("ln_2", "ffn_norm")):
        out[f"{hf_name}.weight"], out[f"{hf_name}.bias"] = p[name]["scale"], p[name]["bias"]
    for hf_name, name in (("mlp.c_fc", "wi"), ("mlp.c_proj", "wo")):
        out[f"{hf_name}.weight"], out[f"{hf_name}.bias"] = p["ffn"][name]["kernel"], p["ffn"][name]["bias"]
    return out


def params_from_hf(tensors: Mapping[str, np.ndarray], cfg: ModelConfig) -> dict:
    """HF GPT-2 tensors (keys with or without the `transformer.` prefix) -> DecoderLM params.

    Layers come out stacked on a leading axis when cfg.scan_layers, else as layers_0, layers_1, ...; float32.
    A missing, extra or misshapen tensor is a ValueError naming it.
    """
    t = hf_folder.Tensors(tensors, "transformer.")
    get = t.get
    wte_VxD = get("wte.weight", (cfg.vocab_size, cfg.d_model))
    if "lm_head.weight" in t:
        if not hf_folder.same(get("lm_head.weight", wte_VxD.shape), wte_VxD):
            raise ValueError(
                f"{hf_folder.WEIGHTS_FILE}: lm_head.weight differs from wte.weight (an untied head is not supported)"
            )
    params = {
        "embed": {
            "tokens": {"embedding": wte_VxD},
            "positions": {"embedding": get("wpe.weight", (cfg.max_len, cfg.d_model))},
        },
        "decoder": {
            "final_norm": {"scale": get("ln_f.weight", (cfg.d_model,)), "bias": get("ln_f.bias", (cfg.d_model,))},
            **{
                f"layers_{i}": _layer_from_hf(lambda n, s, i=i: get(f"h.{i}.{n}", s), cfg)
                for i in range(cfg.num_layers)
            },
        },
    }
    return t.finish(params, cfg, _BUFFER_SUFFIXES)


def params_to_hf(params: Mapping, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """DecoderLM params (scanned or looped layers) -> HF GPT-2 tensors named as save_pretrained names them."""
    params = exportable.looped(params, cfg)
    dec = params["decoder"]
    out = {
        "wte.weight": params["embed"]["tokens"]["embedding"],
        "wpe.weight": params["embed"]["positions"]["embedding"],
        "ln_f.weight": dec["final_norm"]["scale"],
        "ln_f.bias": dec["final_norm"]["bias"],
    }
    for i in range(cfg.num_layers):
        out.update({f"h.{i}.{k}": v for k, v in _layer_to_hf(dec[f"layers_{i}"], cfg).items()})
    return {f"transformer.{k}": np.ascontiguousarray(v) for k, v in out.items()}


# ----------------------------------------------------------------------------------------------------------------
# folders


def load_gpt2(folder) -> tuple[ModelConfig, dict]:
    """A save_pretrained GPT-2 folder -> (ModelConfig, DecoderLM params as float32 numpy)."""
    folder = Path(folder).expanduser()
    cfg = config_from_hf(hf_folder.read_config(folder))
    hf_folder.check_fits(cfg, folder)  # before gigabytes of weights are read
    tensors = hf_folder.read_tensors(folder)
    hf_folder.check_headers(params_from_hf, tensors, cfg)
    return cfg, params_from_hf(tensors, cfg)


def load_gpt2_tokenizer(folder) -> ByteLevelBPETokenizer:
    """GPT-2's BPE from a Hugging Face folder: vocab.json + merges.txt, or the fast tokenizer's tokenizer.json."""
    folder = Path(folder).expanduser()
    if (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():
        hf_folder.read_json(folder / "vocab.json")  # cut short or not JSON: one line naming it, not json's traceback
        return ByteLevelBPETokenizer.from_files(folder / "vocab.json", folder / "merges.txt")
    if not (folder / "tokenizer.json").is_file():
        raise ValueError(f"{folder}: no GPT-2 tokenizer files (vocab.json + merges.txt, or tokenizer.json)")
    hf = hf_folder.read_json(folder / "tokenizer.json")
    model, pre = hf.get("model") or {}, hf.get("pre_tokenizer") or {}
    if model.get("type") != "BPE" or pre.get("type") != "ByteLevel":
        raise ValueError(
            f"{folder / 'tokenizer.json'}: model.type={model.get('type')!r}, pre_tokenizer.type="
            f"{pre.get('type')!r}; GPT-2's is a 'BPE' with a 'ByteLevel' pre-tokenizer"
        )
    merges = [m.split(" ") if isinstance(m, str) else m for m in model["merges"]]
    return ByteLevelBPETokenizer(model["vocab"], merges)


_FOLDER = exportable.DecoderFolder(config_to_hf, config_from_hf, params_to_hf, head_flag=False)
write_gpt2, save_gpt2 = _FOLDER.write, _FOLDER.save
