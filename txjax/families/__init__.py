"""The one seam between model families: everything that differs between a decoder-only LM and an encoder-decoder.

A `Family` names its Flax module, the batch keys that feed it, the data it trains on, the dummy inputs that
initialise it (parameters, or a KV cache), how one decode call appends tokens to the cache, how generation starts
(prefill) and the sizes its FLOP count needs. Training, evaluation, decoding, the summary and the attention maps
ask `family_of(model)` (or `get(config.family)`) instead of testing the model's class, so a third family is one new
file in this package and one line in FAMILIES.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import flax.linen as nn


class Prefill(NamedTuple):
    """The first cached call of a generation (txjax.decode.search.generate_ids) and the cache it writes into."""

    tokens_BxL: Any
    positions_BxL: Any
    segment_ids_BxL: Any  # 0 on left padding
    cache_len: int  # decoder positions the cache holds
    src_len: int | None  # encoder positions (None without an encoder)
    src_segment_ids_BxS: Any  # None without an encoder
    encoded_BxSxD: Any  # None without an encoder
    start_positions_B: Any  # position of each row's first generated token


class Family:
    """What a model family must say; see decoder_lm.py and encoder_decoder.py."""

    name: ClassVar[str]
    module: ClassVar[type[nn.Module]]
    inputs: ClassVar[tuple[str, ...]]  # batch keys, in the order of the module's __call__ arguments
    targets: ClassVar[str]
    weights: ClassVar[str]
    data_kinds: ClassVar[tuple[str, ...]]  # config.data.kind values this family trains on
    task_form: ClassVar[str]  # how a synthetic task lays out its examples: "lm" or "seq2seq"
    continues_input: ClassVar[bool]  # generation continues its input (an LM prompt) or starts a target from BOS

    def init_inputs(self, tokens_1x1) -> tuple:
        """Dummy arguments of `module.init` for the parameters (their shapes do not depend on the length)."""
        raise NotImplementedError

    def decode_variables(self, model, rng, batch: int, max_len: int, src_len: int | None):
        """`model.init(..., decode=True)` on dummy inputs that size a KV cache of `max_len` (and `src_len`)."""
        raise NotImplementedError

    def extend(self, model, variables, tokens_CxL, positions_CxL, segment_ids_CxL, src_segment_ids_CxS, encoded):
        """One cached decode call: -> (logits [C, L, V], mutated variables with the new 'cache')."""
        raise NotImplementedError

    def prefill(self, model, params, inputs_BxS, lengths_B, max_new_tokens: int, bos_id: int) -> Prefill:
        """What the first decode call of a generation feeds, and the cache it needs."""
        raise NotImplementedError

    def batch_lengths(self, batch) -> tuple[int, int, int]:
        """(rows B, source length S (0 without an encoder), target length T) of a training batch."""
        raise NotImplementedError

    def attention_layers(self, cfg) -> tuple[int, int, int]:
        """(encoder self-attention, decoder self-attention, cross-attention) layer counts."""
        raise NotImplementedError

    def head_table(self, cfg) -> str:
        """The top-level module whose token table is the tied LM head."""
        raise NotImplementedError


from txjax.families.decoder_lm import DecoderOnly  # noqa: E402  (they subclass Family)
from txjax.families.encoder_decoder import EncoderDecoderFamily  # noqa: E402

FAMILIES: dict[str, Family] = {f.name: f for f in (DecoderOnly(), EncoderDecoderFamily())}
_BY_MODULE = {f.module: f for f in FAMILIES.values()}


def get(name: str) -> Family:
    """The family of a config's `family` field."""
    if name not in FAMILIES:
        raise ValueError(f"family={name!r} is not one of {', '.join(FAMILIES)}")
    return FAMILIES[name]


def family_of(model) -> Family:
    """The family of a model instance."""
    return _BY_MODULE[type(model)]


def build(name: str, cfg, sow_weights: bool = False) -> nn.Module:
    """The module of family `name` for a ModelConfig."""
    return get(name).module(cfg, sow_weights=sow_weights)
