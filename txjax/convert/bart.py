"""BART checkpoints (Hugging Face BartForConditionalGeneration) -> EncoderDecoder.

BART (Lewis et al. 2020) is Marian's block (txjax.convert.marian: post-LN, biases everywhere, final_logits_bias, the
same tensor names per layer) with GELU, learned positions and a LayerNorm of each stack's input embeddings
(layernorm_embedding -> model.embed_norm). Its position tables have two extra rows in front: position p reads row
p + 2 (BartLearnedPositionalEmbedding's offset), so rows 2 .. max_position_embeddings + 1 become txjax's table and
the first two, never read, are dropped. The encoder and the decoder have position tables of their own while sharing
the token table; txjax's Embedder holds both, so BART is imported with unshared embeddings (share_embeddings=False),
the token table copied into the encoder's and the decoder's Embedder: the same function, two token tables that
fine-tuning may move apart. The decoder starts from decoder_start_token_id (BART's EOS), the imported tokenizer's
BOS.

    model.shared.weight [V, D]                       -> src_embed and tgt_embed tokens.embedding
    model.{encoder,decoder}.embed_positions.weight [max_len + 2, D] -> {src,tgt}_embed.positions.embedding [max_len, D]
    model.{encoder,decoder}.layernorm_embedding      -> {encoder,decoder}.embed_norm
    lm_head.weight (untied only), final_logits_bias  -> tgt_embed.lm_head.kernel, tgt_embed.final_logits_bias.bias

Export (`run.py export` of such a workdir) writes the inverse as BartForConditionalGeneration.save_pretrained names
it, the two never-read position rows zero; BART has one token table, so a model whose encoder and decoder tables
differ (fine-tuning moves them apart) is refused in one line.

Not represented: BartTokenizer's <s> before each source (txjax's encoder-decoder reads a source as its tokens and
EOS; give it as an id when it matters), generation's forced_bos_token_id, and activation_dropout (training only).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from txjax.convert import exportable, hf_folder, marian
from txjax.data.hf_tokenizer import HFTokenizer
from txjax.model.config import ModelConfig

FAMILY = marian.FAMILY
MODEL_TYPES = ("bart",)
OFFSET = 2  # BartLearnedPositionalEmbedding reads row position + 2
_BART_FIELDS = {
    "positional": "learned",
    "embed_norm": True,
    "share_embeddings": False,  # one token table, two position tables: both Embedders hold a copy of the tokens
    "norm": "layernorm",
    "norm_placement": "post",
    "use_bias": True,
    "attention_scale": "sqrt",
    "final_logits_bias": True,
    "qk_norm": False,
    "logit_softcap": 0.0,
    "parametrization": "standard",
}


def config_from_hf(hf: Mapping) -> ModelConfig:
    """A BART config.json (as a dict) -> ModelConfig; unrepresentable fields are a ValueError naming them."""
    for name in ("normalize_before", "add_final_layer_norm"):  # mBART's pre-LN (BartConfig has neither)
        if hf.get(name):
            raise ValueError(f"config.json: {name}={hf[name]!r} is not supported (BART's blocks are post-LN)")
    return marian.shared_config(hf, MODEL_TYPES, **_BART_FIELDS)


def params_from_hf(tensors: Mapping[str, np.ndarray], cfg: ModelConfig) -> dict:
    """HF BartForConditionalGeneration tensors -> EncoderDecoder params, float32, layers stacked when
    cfg.scan_layers. A missing, extra or misshapen tensor is a ValueError naming it."""
    t = hf_folder.Tensors(tensors, "model.")
    d, v, n = cfg.d_model, cfg.vocab_size, cfg.max_len
    tokens = t.get("shared.weight", (v, d))
    params = marian.stacks_from_hf(t, cfg)
    for stack, embedder in (("encoder", "src_embed"), ("decoder", "tgt_embed")):
        marian.equal_copy(t, f"{stack}.embed_tokens.weight", tokens, "model.shared.weight")
        positions = t.get(f"{stack}.embed_positions.weight", (n + OFFSET, d))[OFFSET:]
        params[embedder] = {"tokens": {"embedding": tokens}, "positions": {"embedding": positions}}
        norm = f"{stack}.layernorm_embedding"
        params[stack]["embed_norm"] = {"scale": t.get(f"{norm}.weight", (d,)), "bias": t.get(f"{norm}.bias", (d,))}
    marian.head_from_hf(t, cfg, params["tgt_embed"])
    return t.finish(params, cfg, family=FAMILY)


def load_bart(folder) -> tuple[ModelConfig, dict, HFTokenizer]:
    """A save_pretrained BART folder -> (ModelConfig, EncoderDecoder params as float32 numpy, tokenizer)."""
    folder = Path(folder).expanduser()
    hf = hf_folder.read_config(folder)
    cfg = config_from_hf(hf)  # a bad field fails before the weights are read
    hf_folder.check_fits(cfg, folder, FAMILY)
    tokenizer = marian.read_seq2seq_tokenizer(folder, hf)
    tensors = hf_folder.read_tensors(folder)
    hf_folder.check_headers(params_from_hf, tensors, cfg)
    return cfg, params_from_hf(tensors, cfg), tokenizer


# ----------------------------------------------------------------------------------------------------------------
# EncoderDecoder -> a BartForConditionalGeneration folder


def params_to_hf(params: Mapping, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Inverse of params_from_hf: EncoderDecoder params (scanned or looped) -> HF tensors as
    BartForConditionalGeneration.save_pretrained names them; differing token tables are a ValueError."""
    params = exportable.looped(params, cfg, FAMILY)
    tokens = params["src_embed"]["tokens"]["embedding"]
    if not hf_folder.same(tokens, params["tgt_embed"]["tokens"]["embedding"]):
        raise ValueError(
            "the encoder's and decoder's token tables differ (fine-tuning moved them apart): BART has one, "
            "model.shared.weight, so this model cannot be exported to BART"
        )
    out = {"model.shared.weight": tokens}
    for stack, embedder in (("encoder", "src_embed"), ("decoder", "tgt_embed")):
        positions = params[embedder]["positions"]["embedding"]
        unread = np.zeros((OFFSET, cfg.d_model), np.float32)  # rows 0 and 1: BART reads position p at row p + 2
        out[f"model.{stack}.embed_positions.weight"] = np.concatenate([unread, positions])
        norm = params[stack]["embed_norm"]
        out[f"model.{stack}.layernorm_embedding.weight"] = norm["scale"]
        out[f"model.{stack}.layernorm_embedding.bias"] = norm["bias"]
    out |= marian.head_to_hf(params["tgt_embed"], cfg) | marian.stacks_to_hf(params, cfg)
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def write_bart(folder: Path, cfg: ModelConfig, params: Mapping, tokenizer: HFTokenizer) -> None:
    """Writes a BartForConditionalGeneration folder: config.json, model.safetensors and the tokenizer's files."""
    hf_config = marian.lineage_config_to_hf(cfg, tokenizer, "BartForConditionalGeneration")
    marian.write_seq2seq_folder(folder, cfg, params, tokenizer, hf_config, config_from_hf, params_to_hf)
