"""T5 checkpoints (Hugging Face T5ForConditionalGeneration: T5, T5 v1.1, mT5) -> EncoderDecoder.

T5 (Raffel et al. 2020) is a pre-LN encoder-decoder with RMSNorm without mean or bias (txjax's rmsnorm), no biases,
scores not scaled by 1/sqrt(d_k) (attention_scale='none': the 1/sqrt scaling is folded into the query weights'
init), no position embeddings but a bucketed relative bias on self-attention, one table [buckets, heads] per stack
stored in its first block (positional='relative_buckets'), a ReLU FFN (v1.1 and mT5: gated GELU, 'geglu'), one
token table for both stacks, and a final RMSNorm on each. The original T5 ties the head to the token table and
multiplies the decoder output by d_model^-0.5 before it (config.json's scale_decoder_outputs, or older files'
tie_word_embeddings): that factor is folded into the decoder's final norm gain, g -> g d_model^-0.5, which is the
same function. A stored lm_head.weight that differs from the table is an untied head (v1.1). The decoder starts
from decoder_start_token_id (T5's pad), the imported tokenizer's BOS. Names (no `model.` prefix):

    shared.weight [V, D]                                       -> src_embed.tokens.embedding
    {encoder,decoder}.block.0.layer.0.SelfAttention.relative_attention_bias.weight [N, H] -> {..}.relative_table
    {..}.block.i.layer.0.SelfAttention.{q,k,v} [H*K, D], o [D, H*K] -> self_attention.query/key/value, out
    decoder.block.i.layer.1.EncDecAttention.*                  -> cross_attention.*
    {..}.block.i.layer.j.layer_norm.weight                     -> self_attention_norm, (cross_attention_norm), ffn_norm
    {..}.block.i.layer.-1.DenseReluDense.wi (wi_0, wi_1), wo   -> ffn.wi (wi, wi_gate), wo
    {encoder,decoder}.final_layer_norm.weight                  -> {encoder,decoder}.final_norm

Export (`run.py export` of such a workdir) writes the inverse as T5ForConditionalGeneration.save_pretrained names
it: a tied head as the original T5's (tie_word_embeddings, the d_model^-0.5 taken back out of the decoder's final
norm gain, which any transformers version reads the same way), an untied one as lm_head.weight with
tie_word_embeddings false (no scaling).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from txjax.convert import exportable, hf_folder, marian
from txjax.data.hf_tokenizer import HFTokenizer
from txjax.model.activations import GATED
from txjax.model.config import ModelConfig

FAMILY = marian.FAMILY
MODEL_TYPES = ("t5", "mt5")
# feed_forward_proj -> model.activation (HF's gated-gelu is GELU's tanh form, gelu_new)
HF_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gated-gelu": "geglu", "gated-silu": "swiglu"}
_T5_FIELDS = {
    "positional": "relative_buckets",
    "norm": "rmsnorm",
    "norm_placement": "pre",
    "use_bias": False,
    "attention_scale": "none",
    "share_embeddings": True,
    "embed_scale": False,
    "final_logits_bias": False,
    "qk_norm": False,
    "logit_softcap": 0.0,
    "parametrization": "standard",
}


def _start_id(hf: Mapping):
    """T5's decoder starts from decoder_start_token_id, which older config.json files leave to pad_token_id."""
    start = hf.get("decoder_start_token_id")
    return hf.get("pad_token_id") if start is None else start


def config_from_hf(hf: Mapping, has_head: bool = False) -> ModelConfig:
    """A T5/mT5 config.json (as a dict) -> ModelConfig; `has_head`: the weights hold an lm_head.weight of their own
    (not a copy of the table). Unrepresentable fields are a ValueError naming them."""
    kind = hf.get("model_type")
    if kind not in MODEL_TYPES:
        raise ValueError(f"config.json: model_type={kind!r} is not one of {', '.join(MODEL_TYPES)}")
    hf_folder.integers(hf, "vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_heads")
    ffn = hf.get("feed_forward_proj", "relu")
    if ffn not in HF_ACTIVATIONS:
        raise ValueError(f"config.json: feed_forward_proj={ffn!r} is not one of {', '.join(HF_ACTIVATIONS)}")
    for name, value in (("decoder_start_token_id", _start_id(hf)), ("eos_token_id", hf.get("eos_token_id"))):
        if not isinstance(value, int):
            raise ValueError(f"config.json: {name}={value!r} must be a token id")
    d, h, k = hf["d_model"], hf["num_heads"], hf["d_kv"]
    return ModelConfig(
        vocab_size=hf["vocab_size"],
        d_model=d,
        num_heads=h,
        d_head=None if h * k == d else k,
        d_ff=hf["d_ff"],
        num_layers=hf.get("num_decoder_layers") or hf["num_layers"],
        num_encoder_layers=hf["num_layers"],
        max_len=hf.get("n_positions") or 512,  # relative positions have no table; T5 was trained at 512
        activation=HF_ACTIVATIONS[ffn],
        tie_embeddings=not has_head,
        relative_buckets=hf.get("relative_attention_num_buckets", 32),
        relative_max_distance=hf.get("relative_attention_max_distance", 128),
        norm_eps=float(hf.get("layer_norm_epsilon", 1e-6)),
        init_std=0.02,
        dropout=float(hf.get("dropout_rate", 0.0)),
        attention_dropout=float(hf.get("dropout_rate", 0.0)),
        **_T5_FIELDS,
    )


def _scales_decoder_output(hf: Mapping) -> bool:
    """T5's d_model^-0.5 on the decoder output: scale_decoder_outputs (transformers 5) or tie_word_embeddings."""
    return bool(hf.get("scale_decoder_outputs", hf.get("tie_word_embeddings", True) is not False))


def _attention(get: Callable, cfg: ModelConfig, name: str) -> dict:
    d, h, k = cfg.d_model, cfg.num_heads, cfg.head_dim
    heads = lambda p: get(f"{name}.{p}.weight", (h * k, d)).T.reshape(d, h, k)
    out = get(f"{name}.o.weight", (d, h * k)).T.reshape(h, k, d)
    return {"query": heads("q"), "key": heads("k"), "value": heads("v"), "out": out}


def _layer(get: Callable, cfg: ModelConfig, cross: bool) -> dict:
    """One block's params from `get(name, shape)` (HF tensor `<stack>.block.i.<name>`)."""
    d, f = cfg.d_model, cfg.d_ff
    norm = lambda j: {"scale": get(f"layer.{j}.layer_norm.weight", (d,))}
    j_ffn = 2 if cross else 1
    kernel = lambda name, shape: {"kernel": get(f"layer.{j_ffn}.DenseReluDense.{name}.weight", shape).T}
    if cfg.activation in GATED:
        ffn = {"wi": kernel("wi_0", (f, d)), "wi_gate": kernel("wi_1", (f, d))}
    else:
        ffn = {"wi": kernel("wi", (f, d))}
    layer = {
        "self_attention_norm": norm(0),
        "self_attention": _attention(get, cfg, "layer.0.SelfAttention"),
        "ffn_norm": norm(j_ffn),
        "ffn": ffn | {"wo": kernel("wo", (d, f))},
    }
    if cross:
        layer["cross_attention_norm"] = norm(1)
        layer["cross_attention"] = _attention(get, cfg, "layer.1.EncDecAttention")
    return layer


def params_from_hf(tensors: Mapping[str, np.ndarray], cfg: ModelConfig, scale_output: bool) -> dict:
    """HF T5ForConditionalGeneration tensors -> EncoderDecoder params, float32, layers stacked when
    cfg.scan_layers; scale_output: d_model^-0.5 folded into the decoder's final norm. A missing, extra or misshapen
    tensor is a ValueError naming it."""
    t = hf_folder.Tensors(tensors, "")
    d, v = cfg.d_model, cfg.vocab_size
    tokens = t.get("shared.weight", (v, d))
    embed = {"tokens": {"embedding": tokens}}
    for name in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight"):
        marian.equal_copy(t, name, tokens, "shared.weight")
    if cfg.tie_embeddings:
        marian.equal_copy(t, "lm_head.weight", tokens, "shared.weight")
    else:
        embed["lm_head"] = {"kernel": t.get("lm_head.weight", (v, d)).T}
    params = {"src_embed": embed}
    for stack, n, cross in (("encoder", cfg.encoder_layers, False), ("decoder", cfg.num_layers, True)):
        table = t.get(
            f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
            (cfg.relative_buckets, cfg.num_heads),
        )
        params[stack] = {
            f"layers_{i}": _layer(lambda name, s, p=f"{stack}.block.{i}": t.get(f"{p}.{name}", s), cfg, cross)
            for i in range(n)
        }
        params[stack] |= {
            "relative_table": table,
            "final_norm": {"scale": t.get(f"{stack}.final_layer_norm.weight", (d,))},
        }
    if scale_output:
        params["decoder"]["final_norm"]["scale"] = params["decoder"]["final_norm"]["scale"] * d**-0.5
    return t.finish(params, cfg, family=FAMILY)


def load_t5(folder) -> tuple[ModelConfig, dict, HFTokenizer]:
    """A save_pretrained T5/mT5 folder -> (ModelConfig, EncoderDecoder params as float32 numpy, tokenizer)."""
    folder = Path(folder).expanduser()
    hf = hf_folder.read_config(folder)
    hf_folder.check_fits(config_from_hf(hf, has_head=True), folder, FAMILY)  # a bad field, a model too large
    tokenizer = marian.read_seq2seq_tokenizer(folder, {**hf, "decoder_start_token_id": _start_id(hf)})
    tensors = hf_folder.read_tensors(folder)
    head, table = tensors.get("lm_head.weight"), tensors.get("shared.weight")
    untied = head is not None and (
        table is None or head.shape != table.shape or not np.array_equal(head.read(), table.read())
    )
    cfg = config_from_hf(hf, has_head=untied)
    convert = lambda named, cfg: params_from_hf(named, cfg, _scales_decoder_output(hf))
    hf_folder.check_headers(convert, tensors, cfg)
    return cfg, convert(tensors, cfg), tokenizer


# ----------------------------------------------------------------------------------------------------------------
# EncoderDecoder -> a T5ForConditionalGeneration folder


def config_to_hf(cfg: ModelConfig, tokenizer: HFTokenizer) -> dict:
    """ModelConfig -> a config.json that T5ForConditionalGeneration loads; an activation T5 lacks is a ValueError
    naming it, another field it cannot hold is refused when it is read back (exportable.check_fields)."""
    names = {mine: hf for hf, mine in HF_ACTIVATIONS.items()}
    if cfg.activation not in names:
        raise ValueError(f"model.activation={cfg.activation!r} cannot be exported to T5 (one of {', '.join(names)})")
    return {
        "architectures": ["T5ForConditionalGeneration"],
        "model_type": "t5",
        "vocab_size": cfg.vocab_size,
        "d_model": cfg.d_model,
        "d_kv": cfg.head_dim,
        "d_ff": cfg.d_ff,
        "num_layers": cfg.encoder_layers,
        "num_decoder_layers": cfg.num_layers,
        "num_heads": cfg.num_heads,
        "n_positions": cfg.max_len,
        "relative_attention_num_buckets": cfg.relative_buckets,
        "relative_attention_max_distance": cfg.relative_max_distance,
        "feed_forward_proj": names[cfg.activation],
        "layer_norm_epsilon": cfg.norm_eps,
        "dropout_rate": cfg.dropout,
        "tie_word_embeddings": cfg.tie_embeddings,
        "scale_decoder_outputs": cfg.tie_embeddings,
        "decoder_start_token_id": tokenizer.bos_id,
        "eos_token_id": tokenizer.eos_id,
        "pad_token_id": tokenizer.pad_id,
        "is_encoder_decoder": True,
        "dtype": "float32",
    }


def _layer_to_hf(p: Mapping, cross: bool, gated: bool) -> dict:
    """Inverse of _layer: one block's params -> {name: array} without the `<stack>.block.i.` prefix."""
    out = {}
    attentions = (("layer.0.SelfAttention", "self_attention"),)
    attentions += (("layer.1.EncDecAttention", "cross_attention"),) if cross else ()
    for hf, mine in attentions:
        a = p[mine]
        for x, name in (("q", "query"), ("k", "key"), ("v", "value")):
            out[f"{hf}.{x}.weight"] = a[name].reshape(a[name].shape[0], -1).T
        out[f"{hf}.o.weight"] = a["out"].reshape(-1, a["out"].shape[-1]).T
    j_ffn = 2 if cross else 1
    norms = {0: "self_attention_norm", j_ffn: "ffn_norm"} | ({1: "cross_attention_norm"} if cross else {})
    out |= {f"layer.{j}.layer_norm.weight": p[mine]["scale"] for j, mine in norms.items()}
    ffn = {"wi_0": "wi", "wi_1": "wi_gate"} if gated else {"wi": "wi"}
    out |= {f"layer.{j_ffn}.DenseReluDense.{hf}.weight": p["ffn"][mine]["kernel"].T for hf, mine in ffn.items()}
    out[f"layer.{j_ffn}.DenseReluDense.wo.weight"] = p["ffn"]["wo"]["kernel"].T
    return out


def params_to_hf(params: Mapping, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Inverse of params_from_hf (a tied head scaled as config_to_hf says): EncoderDecoder params (scanned or
    looped) -> HF tensors as T5ForConditionalGeneration.save_pretrained names them."""
    params = exportable.looped(params, cfg, FAMILY)
    embed = params["src_embed"]
    out = {"shared.weight": embed["tokens"]["embedding"]}
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = embed["lm_head"]["kernel"].T
    for stack, n, cross in (("encoder", cfg.encoder_layers, False), ("decoder", cfg.num_layers, True)):
        for i in range(n):
            layer = _layer_to_hf(params[stack][f"layers_{i}"], cross, cfg.activation in GATED)
            out.update({f"{stack}.block.{i}.{k}": v for k, v in layer.items()})
        table = f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
        out[table] = params[stack]["relative_table"]
        out[f"{stack}.final_layer_norm.weight"] = params[stack]["final_norm"]["scale"]
    if cfg.tie_embeddings:  # T5 multiplies the decoder output by d_model^-0.5 before a tied head
        out["decoder.final_layer_norm.weight"] = out["decoder.final_layer_norm.weight"] * cfg.d_model**0.5
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def write_t5(folder: Path, cfg: ModelConfig, params: Mapping, tokenizer: HFTokenizer) -> None:
    """Writes a T5ForConditionalGeneration folder: config.json, model.safetensors and the tokenizer's files."""
    hf_config, read_back = (
        config_to_hf(cfg, tokenizer),
        functools.partial(config_from_hf, has_head=not cfg.tie_embeddings),
    )
    marian.write_seq2seq_folder(folder, cfg, params, tokenizer, hf_config, read_back, params_to_hf)
