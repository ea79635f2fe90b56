"""The decoder-only LM family (GPT-2 / nanoGPT): batches of inputs -> next-token targets, prompts continued."""

from __future__ import annotations

import jax.numpy as jnp

from txjax import families
from txjax.models import DecoderLM


class DecoderOnly(families.Family):
    name = "decoder_lm"
    module = DecoderLM
    inputs = ("inputs", "positions", "segment_ids")
    targets, weights = "targets", "weights"
    data_kinds = ("text", "synthetic", "shards")
    task_form = "lm"
    continues_input = True  # generation continues the prompt (left-padded, so every row ends where it goes on)

    def init_inputs(self, tokens_1x1):
        return (tokens_1x1,)

    def decode_variables(self, model, rng, batch, max_len, src_len):
        return model.init(rng, jnp.zeros((batch, max_len), jnp.int32), decode=True)

    def extend(self, model, variables, tokens_CxL, positions_CxL, segment_ids_CxL, src_segment_ids_CxS, encoded):
        return model.apply(variables, tokens_CxL, positions_CxL, segment_ids_CxL, decode=True, mutable=["cache"])

    def prefill(self, model, params, prompt_BxP, lengths_B, max_new_tokens, bos_id):
        """Left-padded prompts (real tokens last): positions start at 0 at each row's first real token and pad
        slots are segment 0 (stored as empty), so each row generates what it would alone."""
        b, p = prompt_BxP.shape
        first_real_B = p - lengths_B
        positions_BxP = jnp.maximum(jnp.arange(p)[None, :] - first_real_B[:, None], 0)
        segment_ids_BxP = (jnp.arange(p)[None, :] >= first_real_B[:, None]).astype(jnp.int32)
        return families.Prefill(
            prompt_BxP, positions_BxP, segment_ids_BxP, p + max_new_tokens - 1, None, None, None, lengths_B
        )

    def batch_lengths(self, batch):
        b, t = batch["inputs"].shape
        return b, 0, t

    def attention_layers(self, cfg):
        return 0, cfg.num_layers, 0

    def head_table(self, cfg):
        return "embed"
