"""The decoder-only LM family (GPT-2 / nanoGPT): batches of inputs -> next-token targets, prompts continued."""

from __future__ import annotations

import math

import numpy as np

from txjax.families.family import Family
from txjax.model.linear_config import full_layers
from txjax.model.models import DecoderLM


class DecoderLMFamily(Family):
    name = "decoder_lm"
    module = DecoderLM
    inputs = ("inputs", "positions", "segment_ids")
    labels = ("targets", "weights")
    source = None
    data_kinds = {"text": "text", "synthetic": "lm", "chat": "chat", "shards": "shards"}
    ring_attention = True

    def longest(self, data, dataset):
        return dataset.seq_len if data.kind == "synthetic" else data.seq_len  # a task's own; a corpus' windows

    def max_new_tokens(self, cfg, longest_input):
        return cfg.max_len - longest_input + 1  # the last new token is never fed back

    def encode(self, model, params, source):
        if source is not None:
            raise ValueError("a decoder-only LM reads no source: give its prompts only")
        return None

    def decode_step(self, model, variables, context, tokens_CxL, positions_CxL, segment_ids_CxL=None, prefill=False):
        return model.apply(variables, tokens_CxL, positions_CxL, segment_ids_CxL, decode=True, mutable=["cache"])

    def scored_logits(self, model, params, tokens_BxL, positions_BxL, mask_Bx1xLxL, scored_BxC):
        return model.apply({"params": params}, tokens_BxL, positions_BxL, mask=mask_Bx1xLxL, scored=scored_BxC)

    def prompts(self, inputs, bos_id):
        return list(inputs), None

    def read_text(self, tokenizer, text, *, bos=False):
        """A pretrained model's BOS (tokenizer.prefix()), then the text; the outputs continue it."""
        return tokenizer.prefix() + [tokenizer.bos_id] * bos + tokenizer.encode(text), text

    def slides(self, strategy):
        """Greedy and sampled continuations slide past the context; beam search compares whole hypotheses, so its
        stay within it."""
        return strategy["method"] != "beam"

    def output_limit(self, cfg):
        return math.inf

    def attention_target(self, bos_id, target_ids):
        return None

    def check_scores_text(self, where, command, fix=""):
        pass

    def attention_example(self, ids, target_ids):
        return [np.asarray([ids], np.int32)], {"decoder/self_attention": ("", "source", "source")}

    def attention_layers(self, cfg):
        return 0, full_layers(cfg), 0

    def head_table(self, cfg):
        return "embed"
