"""The encoder-decoder family (Vaswani et al. 2017): source and target batches, sources translated from BOS."""

from __future__ import annotations

import jax.numpy as jnp

from txjax import families
from txjax.models import EncoderDecoder


class EncoderDecoderFamily(families.Family):
    name = "encoder_decoder"
    module = EncoderDecoder
    inputs = ("src", "tgt_inputs", "src_positions", "src_segment_ids", "tgt_positions", "tgt_segment_ids")
    targets, weights = "tgt_targets", "tgt_weights"
    data_kinds = ("parallel", "synthetic", "shards")  # shards of TSV pairs
    task_form = "seq2seq"
    continues_input = False  # the source is read whole by the encoder (right-padded); the target starts from BOS

    def init_inputs(self, tokens_1x1):
        return (tokens_1x1, tokens_1x1)

    def decode_variables(self, model, rng, batch, max_len, src_len):
        tokens_BxL = jnp.zeros((batch, max_len), jnp.int32)
        encoded_BxSxD = jnp.zeros((batch, src_len, model.cfg.d_model), model.cfg.compute_dtype)
        src_segment_ids_BxS = jnp.ones((batch, src_len), jnp.int32)
        return model.init(
            rng, tokens_BxL, encoded_BxSxD, src_segment_ids_BxS, decode=True, method=EncoderDecoder.decode
        )

    def extend(self, model, variables, tokens_CxL, positions_CxL, segment_ids_CxL, src_segment_ids_CxS, encoded):
        """`encoded` given at prefill (cross-attention K/V get cached), None afterwards (they are reused)."""
        args = (tokens_CxL, encoded, src_segment_ids_CxS, positions_CxL, segment_ids_CxL)
        return model.apply(variables, *args, decode=True, mutable=["cache"], method=EncoderDecoder.decode)

    def prefill(self, model, params, src_BxS, lengths_B, max_new_tokens, bos_id):
        """Right-padded sources, encoded once (the prefill caches cross-attention's K/V); the decoder's first input
        is BOS at position 0."""
        b, s = src_BxS.shape
        src_segment_ids_BxS = (jnp.arange(s)[None, :] < lengths_B[:, None]).astype(jnp.int32)
        encoded_BxSxD = model.apply(
            {"params": params}, src_BxS, None, src_segment_ids_BxS, method=EncoderDecoder.encode
        )
        bos_Bx1, zeros_Bx1 = jnp.full((b, 1), bos_id, jnp.int32), jnp.zeros((b, 1), jnp.int32)
        return families.Prefill(
            bos_Bx1, zeros_Bx1, None, max_new_tokens, s, src_segment_ids_BxS, encoded_BxSxD, jnp.ones((b,), jnp.int32)
        )

    def batch_lengths(self, batch):
        (b, s), t = batch["src"].shape, batch["tgt_inputs"].shape[1]
        return b, s, t

    def attention_layers(self, cfg):
        return cfg.encoder_layers, cfg.num_layers, cfg.num_layers

    def head_table(self, cfg):
        return "src_embed" if cfg.share_embeddings else "tgt_embed"
