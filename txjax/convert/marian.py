"""Marian checkpoints (Hugging Face MarianMTModel: the opus-mt translation models) -> EncoderDecoder.

Marian (Junczys-Dowmunt et al. 2018) is the 2017 Transformer: post-LN blocks (LayerNorm after each residual
addition, no final norm), biases on every projection, token embeddings scaled by sqrt(d_model) (scale_embedding),
sinusoidal positions with the sines in the first half of the channels and the cosines in the second
(positional='sinusoidal_halves'; HF does not store the table), one vocabulary shared by source and target
(share_encoder_decoder_embeddings), a head tied to it, and a bias on the logits (final_logits_bias). The decoder
starts from decoder_start_token_id, which is Marian's pad id: the imported tokenizer's BOS is that id, so training
batches, `generate` and `run.py eval` start targets where Marian does. HF Linear weights are [out, in]:

    model.shared.weight [V, D]                -> src_embed.tokens.embedding  (unshared: model.encoder.embed_tokens,
                                                 model.decoder.embed_tokens -> src_embed, tgt_embed)
    lm_head.weight [V, D] (untied only)       -> the head table's lm_head.kernel [D, V]
    final_logits_bias [1, V]                  -> the head table's final_logits_bias.bias [V]
    {encoder,decoder}.layers.i.self_attn.{q,k,v}_proj [H*K, D] (+ bias) -> self_attention.query/key/value [D, H, K]
    ... .self_attn.out_proj [D, H*K] (+ bias) -> self_attention.out [H, K, D], out_bias
    decoder.layers.i.encoder_attn.*           -> cross_attention.* (the same layout)
    self_attn_layer_norm, encoder_attn_layer_norm, final_layer_norm -> self_attention_norm, cross_attention_norm,
                                                 ffn_norm;  fc1, fc2 [out, in] -> ffn.wi, ffn.wo [in, out]

activation_dropout (dropout inside the FFN, training only) has no txjax counterpart and is dropped; a field that
changes the function computed (a decoder vocabulary of its own, different encoder and decoder widths, an activation
txjax lacks) is a one-line ValueError naming the config.json field.

Export (`run.py export` of such a workdir) writes the inverse: config.json, model.safetensors as
MarianMTModel.save_pretrained names them, and the tokenizer's files.

Tokenizer: the folder's tokenizer.json (a `tokenizers` pipeline). Marian's own source.spm/target.spm + vocab.json
(MarianTokenizer, which has no fast form in transformers) are not read: a folder with only those is refused in one
line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from txjax.convert import exportable, hf_folder
from txjax.data.hf_tokenizer import HFTokenizer
from txjax.families import ENCODER_DECODER
from txjax.model.config import ModelConfig

FAMILY = ENCODER_DECODER
MODEL_TYPES = ("marian",)
# HF activation_function -> model.activation
HF_ACTIVATIONS = {
    "relu": "relu",
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "swish": "silu",
    "silu": "silu",
}
# ModelConfig fields Marian fixes
_MARIAN_FIELDS = {
    "positional": "sinusoidal_halves",
    "norm": "layernorm",
    "norm_placement": "post",
    "use_bias": True,
    "attention_scale": "sqrt",
    "final_logits_bias": True,
    "embed_norm": False,
    "qk_norm": False,
    "logit_softcap": 0.0,
    "parametrization": "standard",
}
_BUFFERS = ("embed_positions.weight",)  # old checkpoints store the sinusoid table; it is recomputed


# ----------------------------------------------------------------------------------------------------------------
# config.json -> ModelConfig


def _same(hf: Mapping, encoder: str, decoder: str) -> int:
    """A size the encoder and decoder must share in txjax (one num_heads, one d_ff)."""
    hf_folder.integers(hf, encoder, decoder)
    if hf[encoder] != hf[decoder]:
        raise ValueError(
            f"config.json: {decoder}={hf[decoder]} differs from {encoder}={hf[encoder]} (txjax's encoder and "
            "decoder share one size)"
        )
    return hf[encoder]


def config_from_hf(hf: Mapping) -> ModelConfig:
    """A Marian config.json (as a dict) -> ModelConfig; unrepresentable fields are a ValueError naming them."""
    if hf.get("decoder_vocab_size") not in (None, hf.get("vocab_size")):
        raise ValueError(
            f"config.json: decoder_vocab_size={hf['decoder_vocab_size']} differs from vocab_size={hf['vocab_size']} "
            "(txjax's source and target share one vocabulary size)"
        )
    share = hf.get("share_encoder_decoder_embeddings", True)
    return shared_config(hf, MODEL_TYPES, share_embeddings=share, **_MARIAN_FIELDS)


def shared_config(hf: Mapping, model_types: tuple[str, ...], **fields) -> ModelConfig:
    """The ModelConfig of a BART-lineage config.json (Marian, BART): sizes, activation, dropout, embedding scale and
    tying, then `fields` (what the family fixes); a field txjax cannot represent is a ValueError naming it."""
    kind = hf.get("model_type")
    if kind not in model_types:
        raise ValueError(f"config.json: model_type={kind!r} is not one of {', '.join(model_types)}")
    hf_folder.integers(hf, "vocab_size", "d_model", "encoder_layers", "decoder_layers", "max_position_embeddings")
    act = hf.get("activation_function", "gelu")
    if act not in HF_ACTIVATIONS:
        raise ValueError(f"config.json: activation_function={act!r} is not one of {', '.join(HF_ACTIVATIONS)}")
    for name in ("decoder_start_token_id", "eos_token_id", "pad_token_id"):
        if not isinstance(hf.get(name), int):
            raise ValueError(f"config.json: {name}={hf.get(name)!r} must be a token id")
    return ModelConfig(
        vocab_size=hf["vocab_size"],
        d_model=hf["d_model"],
        num_heads=_same(hf, "encoder_attention_heads", "decoder_attention_heads"),
        d_ff=_same(hf, "encoder_ffn_dim", "decoder_ffn_dim"),
        num_layers=hf["decoder_layers"],
        num_encoder_layers=hf["encoder_layers"],
        max_len=hf["max_position_embeddings"],
        activation=HF_ACTIVATIONS[act],
        tie_embeddings=hf.get("tie_word_embeddings", True),
        embed_scale=bool(hf.get("scale_embedding", False)),
        norm_eps=1e-5,  # torch.nn.LayerNorm's default, which these models' layers use
        init_std=hf.get("init_std", 0.02),
        dropout=float(hf.get("dropout", 0.0)),
        attention_dropout=float(hf.get("attention_dropout", 0.0)),
        **fields,
    )


# ----------------------------------------------------------------------------------------------------------------
# tensors -> params


def _attention(get: Callable, cfg: ModelConfig, name: str) -> dict:
    """q/k/v/out projections and their biases of `name` (self_attn, encoder_attn)."""
    d, h, k = cfg.d_model, cfg.num_heads, cfg.head_dim
    heads = lambda p: get(f"{name}.{p}_proj.weight", (h * k, d)).T.reshape(d, h, k)
    head_bias = lambda p: get(f"{name}.{p}_proj.bias", (h * k,)).reshape(h, k)
    return {
        "query": heads("q"),
        "key": heads("k"),
        "value": heads("v"),
        "out": get(f"{name}.out_proj.weight", (d, h * k)).T.reshape(h, k, d),
        "query_bias": head_bias("q"),
        "key_bias": head_bias("k"),
        "value_bias": head_bias("v"),
        "out_bias": get(f"{name}.out_proj.bias", (d,)),
    }


def _layer(get: Callable, cfg: ModelConfig, cross: bool) -> dict:
    """One block's params from `get(name, shape)` (HF tensor `<stack>.layers.i.<name>` as float32 of that shape)."""
    d, f = cfg.d_model, cfg.d_ff
    norm = lambda name: {"scale": get(f"{name}.weight", (d,)), "bias": get(f"{name}.bias", (d,))}
    dense = lambda name, n_out, n_in: {
        "kernel": get(f"{name}.weight", (n_out, n_in)).T,
        "bias": get(f"{name}.bias", (n_out,)),
    }
    layer = {
        "self_attention": _attention(get, cfg, "self_attn"),
        "self_attention_norm": norm("self_attn_layer_norm"),
        "ffn": {"wi": dense("fc1", f, d), "wo": dense("fc2", d, f)},
        "ffn_norm": norm("final_layer_norm"),
    }
    if cross:
        layer["cross_attention"] = _attention(get, cfg, "encoder_attn")
        layer["cross_attention_norm"] = norm("encoder_attn_layer_norm")
    return layer


def equal_copy(t: hf_folder.Tensors, name: str, table: np.ndarray, what: str) -> None:
    """A checkpoint may store a tied or shared table twice; the copy must be the table."""
    if name in t and not hf_folder.same(t.get(name, table.shape), table):
        raise ValueError(f"{hf_folder.WEIGHTS_FILE}: {name} differs from {what}, which config.json ties it to")


def params_from_hf(tensors: Mapping[str, np.ndarray], cfg: ModelConfig) -> dict:
    """HF MarianMTModel tensors -> EncoderDecoder params, float32, layers stacked when cfg.scan_layers. A missing,
    extra or misshapen tensor is a ValueError naming it."""
    t = hf_folder.Tensors(tensors, "model.")
    d, v = cfg.d_model, cfg.vocab_size
    if cfg.share_embeddings:
        src = tgt = t.get("shared.weight", (v, d))
        equal_copy(t, "encoder.embed_tokens.weight", src, "model.shared.weight")
        equal_copy(t, "decoder.embed_tokens.weight", src, "model.shared.weight")
        params = {"src_embed": {"tokens": {"embedding": src}}}
    else:
        src, tgt = t.get("encoder.embed_tokens.weight", (v, d)), t.get("decoder.embed_tokens.weight", (v, d))
        if "shared.weight" in t:
            t.get("shared.weight", (v, d))  # unused by an unshared model (HF keeps it for resizing)
        params = {"src_embed": {"tokens": {"embedding": src}}, "tgt_embed": {"tokens": {"embedding": tgt}}}
    head_from_hf(t, cfg, params["src_embed" if cfg.share_embeddings else "tgt_embed"])
    return t.finish(params | stacks_from_hf(t, cfg), cfg, _BUFFERS, FAMILY)


def head_from_hf(t: hf_folder.Tensors, cfg: ModelConfig, head: dict) -> None:
    """Adds the LM head (untied: lm_head.weight; tied: a stored copy must be the table) and final_logits_bias to the
    params of the Embedder whose token table `head` holds."""
    v, d = cfg.vocab_size, cfg.d_model
    if cfg.tie_embeddings:
        equal_copy(t, "lm_head.weight", head["tokens"]["embedding"], "the decoder's token embedding")
    else:
        head["lm_head"] = {"kernel": t.get("lm_head.weight", (v, d)).T}
    head["final_logits_bias"] = {"bias": t.get("final_logits_bias", (1, v))[0]}


def stacks_from_hf(t: hf_folder.Tensors, cfg: ModelConfig) -> dict:
    """{"encoder": {layers_i}, "decoder": {layers_i}} from `encoder.layers.i.*` and `decoder.layers.i.*`."""
    params = {}
    for stack, n, cross in (("encoder", cfg.encoder_layers, False), ("decoder", cfg.num_layers, True)):
        params[stack] = {
            f"layers_{i}": _layer(lambda name, s, p=f"{stack}.layers.{i}": t.get(f"{p}.{name}", s), cfg, cross)
            for i in range(n)
        }
    return params


# ----------------------------------------------------------------------------------------------------------------
# folders


def read_seq2seq_tokenizer(folder: Path, hf: Mapping, around: tuple[list[int], list[int]] | None = None) -> HFTokenizer:
    """The folder's tokenizer.json with BOS = decoder_start_token_id (where Marian's targets start: its pad id),
    EOS and pad from config.json; a source's specials `around` it (before, after), by default those its
    post-processor adds (BART's <s> ... </s>, T5's ... </s>)."""
    if not (folder / "tokenizer.json").is_file() and (folder / "source.spm").is_file():
        raise ValueError(
            f"{folder}: Marian's source.spm/target.spm are not read (MarianTokenizer has no fast form); save a "
            "`tokenizers` pipeline of the same vocabulary as tokenizer.json beside them"
        )
    read = hf_folder.read_tokenizer(folder, hf)
    before, after = around or read.around()
    ids = dict(bos_id=hf["decoder_start_token_id"], eos_id=hf["eos_token_id"], pad_id=hf["pad_token_id"])
    return HFTokenizer(read.tok, **ids, before=before, after=after)


def load_marian(folder) -> tuple[ModelConfig, dict, HFTokenizer]:
    """A save_pretrained MarianMTModel folder -> (ModelConfig, EncoderDecoder params as float32 numpy, tokenizer)."""
    folder = Path(folder).expanduser()
    hf = hf_folder.read_config(folder)
    cfg = config_from_hf(hf)  # a bad field fails before the weights are read
    hf_folder.check_fits(cfg, folder, FAMILY)
    # MarianTokenizer (SentencePiece, no fast form: the tokenizer.json beside it is a stand-in) ends a source with
    # EOS and puts nothing before it, whatever the stand-in's post-processor says
    tokenizer = read_seq2seq_tokenizer(folder, hf, around=([], [hf["eos_token_id"]]))
    tensors = hf_folder.read_tensors(folder)
    hf_folder.check_headers(params_from_hf, tensors, cfg)
    return cfg, params_from_hf(tensors, cfg), tokenizer


# ----------------------------------------------------------------------------------------------------------------
# EncoderDecoder -> a MarianMTModel folder


def config_to_hf(cfg: ModelConfig, tokenizer: HFTokenizer) -> dict:
    """ModelConfig -> a config.json that MarianMTModel loads (lineage_config_to_hf: what it refuses)."""
    hf = lineage_config_to_hf(cfg, tokenizer, "MarianMTModel")
    return hf | {"decoder_vocab_size": cfg.vocab_size, "share_encoder_decoder_embeddings": cfg.share_embeddings}


def lineage_config_to_hf(cfg: ModelConfig, tokenizer: HFTokenizer, architecture: str) -> dict:
    """The config.json fields of a BART-lineage model (Marian, BART) that `architecture` loads; an activation it lacks
    is a ValueError naming it, another field it cannot hold (one of the fields the family fixes, grouped-query
    attention, a d_head of its own) is refused when it is read back (exportable.check_fields)."""
    kind = architecture.removesuffix("MTModel").removesuffix("ForConditionalGeneration")
    names = {mine: hf for hf, mine in HF_ACTIVATIONS.items() if hf not in ("silu", "gelu_pytorch_tanh")}
    if cfg.activation not in names:
        raise ValueError(
            f"model.activation={cfg.activation!r} cannot be exported to {kind} (needs one of {', '.join(names)})"
        )
    return {
        "architectures": [architecture],
        "model_type": kind.lower(),
        "vocab_size": cfg.vocab_size,
        "d_model": cfg.d_model,
        "encoder_layers": cfg.encoder_layers,
        "decoder_layers": cfg.num_layers,
        "encoder_attention_heads": cfg.num_heads,
        "decoder_attention_heads": cfg.num_heads,
        "encoder_ffn_dim": cfg.d_ff,
        "decoder_ffn_dim": cfg.d_ff,
        "max_position_embeddings": cfg.max_len,
        "activation_function": names[cfg.activation],
        "scale_embedding": cfg.embed_scale,
        "tie_word_embeddings": cfg.tie_embeddings,
        "dropout": cfg.dropout,
        "attention_dropout": cfg.attention_dropout,
        "init_std": cfg.init_std,
        "decoder_start_token_id": tokenizer.bos_id,
        "eos_token_id": tokenizer.eos_id,
        "pad_token_id": tokenizer.pad_id,
        "forced_eos_token_id": tokenizer.eos_id,
        "is_encoder_decoder": True,
        "dtype": "float32",
    }


def _layer_to_hf(p: Mapping, cfg: ModelConfig, cross: bool) -> dict:
    """Inverse of _layer: one block's params -> {name: array} without the `<stack>.layers.i.` prefix."""
    d = cfg.d_model
    out = {}
    attentions = (("self_attn", "self_attention"),) + ((("encoder_attn", "cross_attention"),) if cross else ())
    for hf, mine in attentions:
        a = p[mine]
        for x, name in (("q", "query"), ("k", "key"), ("v", "value")):
            out[f"{hf}.{x}_proj.weight"] = a[name].reshape(d, -1).T
            out[f"{hf}.{x}_proj.bias"] = a[f"{name}_bias"].reshape(-1)
        out[f"{hf}.out_proj.weight"], out[f"{hf}.out_proj.bias"] = a["out"].reshape(-1, d).T, a["out_bias"]
    norms = {"self_attn_layer_norm": "self_attention_norm", "final_layer_norm": "ffn_norm"}
    norms |= {"encoder_attn_layer_norm": "cross_attention_norm"} if cross else {}
    for hf, mine in norms.items():
        out[f"{hf}.weight"], out[f"{hf}.bias"] = p[mine]["scale"], p[mine]["bias"]
    for hf, mine in (("fc1", "wi"), ("fc2", "wo")):
        out[f"{hf}.weight"], out[f"{hf}.bias"] = p["ffn"][mine]["kernel"].T, p["ffn"][mine]["bias"]
    return out


_EMBEDDERS = (("encoder", "src_embed"), ("decoder", "tgt_embed"))


def head_to_hf(head: Mapping, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Inverse of head_from_hf: lm_head.weight (untied only) and final_logits_bias of the Embedder `head`."""
    out = {} if cfg.tie_embeddings else {"lm_head.weight": head["lm_head"]["kernel"].T}
    return out | {"final_logits_bias": head["final_logits_bias"]["bias"][None]}


def stacks_to_hf(params: Mapping, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Inverse of stacks_from_hf: every block of looped params as `model.{encoder,decoder}.layers.i.*`."""
    out = {}
    for stack, n, cross in (("encoder", cfg.encoder_layers, False), ("decoder", cfg.num_layers, True)):
        for i in range(n):
            layer = _layer_to_hf(params[stack][f"layers_{i}"], cfg, cross)
            out.update({f"model.{stack}.layers.{i}.{k}": v for k, v in layer.items()})
    return out


def params_to_hf(params: Mapping, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """EncoderDecoder params (scanned or looped) -> HF tensors named as MarianMTModel.save_pretrained names them."""
    params = exportable.looped(params, cfg, FAMILY)
    if cfg.share_embeddings:
        out = {"model.shared.weight": params["src_embed"]["tokens"]["embedding"]}
    else:
        out = {f"model.{stack}.embed_tokens.weight": params[e]["tokens"]["embedding"] for stack, e in _EMBEDDERS}
    out |= head_to_hf(params["src_embed" if cfg.share_embeddings else "tgt_embed"], cfg) | stacks_to_hf(params, cfg)
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def write_seq2seq_folder(
    folder: Path, cfg: ModelConfig, params: Mapping, tokenizer: HFTokenizer, hf_config: Mapping, read_back, to_hf
) -> None:
    """config.json + model.safetensors (to_hf's tensors of params, once exportable.checked found hf_config, read back
    by read_back, and them whole) + the tokenizer's files into `folder` (from_pretrained and AutoTokenizer load
    them)."""
    tensors = exportable.checked(cfg, params, hf_config, read_back, to_hf, FAMILY)
    hf_folder.write_folder(folder, hf_config, tensors)
    hf_folder.write_tokenizer(folder, tokenizer, cfg.max_len)


def write_marian(folder: Path, cfg: ModelConfig, params: Mapping, tokenizer: HFTokenizer) -> None:
    """Writes a MarianMTModel folder: config.json, model.safetensors and the tokenizer's files."""
    write_seq2seq_folder(folder, cfg, params, tokenizer, config_to_hf(cfg, tokenizer), config_from_hf, params_to_hf)
