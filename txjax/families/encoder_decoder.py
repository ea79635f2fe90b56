"""The encoder-decoder family (Vaswani et al. 2017): source and target batches, sources translated from BOS."""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from txjax.families.family import Family
from txjax.model.linear_config import full_layers
from txjax.model.models import EncoderDecoder


class Source(NamedTuple):
    """An encoder-decoder's decode context: the encoder output and the source's segments (0 on padding)."""

    encoded_BxSxD: jnp.ndarray
    segment_ids_BxS: jnp.ndarray


def pair_lengths(data, dataset) -> tuple[int, int]:
    """(source, target) lengths of a pair's rows: a synthetic task's own, else the data section's limits."""
    return (dataset.src_len, dataset.tgt_len) if data.kind == "synthetic" else (data.max_src_len, data.max_tgt_len)


class EncoderDecoderFamily(Family):
    name = "encoder_decoder"
    module = EncoderDecoder
    inputs = ("src", "tgt_inputs", "src_positions", "src_segment_ids", "tgt_positions", "tgt_segment_ids")
    labels = ("tgt_targets", "tgt_weights")
    source = "src"
    data_kinds = {"parallel": "parallel", "synthetic": "seq2seq", "shards": "shards of pairs"}  # shards: TSV pairs
    source_modules = ("encoder",)

    def longest(self, data, dataset):
        return max(pair_lengths(data, dataset))

    def max_new_tokens(self, cfg, longest_input):
        return cfg.max_len  # the target's own positions, from BOS

    def encode(self, model, params, source):
        """Right-padded sources [B, S] with their lengths [B] -> Source, encoded once per generation."""
        if source is None:
            raise ValueError("an encoder-decoder generates from sources: give them as its inputs")
        src_BxS, lengths_B = source
        segment_ids_BxS = (jnp.arange(src_BxS.shape[1])[None, :] < lengths_B[:, None]).astype(jnp.int32)
        encoded_BxSxD = model.apply({"params": params}, src_BxS, None, segment_ids_BxS, method=EncoderDecoder.encode)
        return Source(encoded_BxSxD, segment_ids_BxS)

    def decode_step(self, model, variables, context, tokens_CxL, positions_CxL, segment_ids_CxL=None, prefill=False):
        """The prefill computes cross-attention's keys/values from the encoder output and caches them; the later
        calls reuse them (encoded=None), so the context's rows need only its segments."""
        encoded_BxSxD = context.encoded_BxSxD if prefill else None
        args = (tokens_CxL, encoded_BxSxD, context.segment_ids_BxS, positions_CxL, segment_ids_CxL)
        return model.apply(variables, *args, decode=True, mutable=["cache"], method=EncoderDecoder.decode)

    def prompts(self, inputs, bos_id):
        """Sources; each target starts from BOS."""
        if bos_id is None:
            raise ValueError("an encoder-decoder's targets start from BOS: give bos_id")
        return [[bos_id]] * len(inputs), list(inputs)

    def attention_example(self, ids, target_ids):
        if not target_ids:
            raise ValueError("an encoder-decoder needs target_ids (the decoder's inputs, starting with BOS)")
        inputs = [np.asarray([ids], np.int32), np.asarray([target_ids], np.int32)]
        return inputs, {
            "encoder/self_attention": ("-encoder", "source", "source"),
            "decoder/self_attention": ("-decoder", "target", "target"),
            "decoder/cross_attention": ("-cross", "target", "source"),
        }

    def attention_layers(self, cfg):
        return cfg.encoder_layers, full_layers(cfg), cfg.num_layers

    def head_table(self, cfg):
        return "src_embed" if cfg.share_embeddings else "tgt_embed"
