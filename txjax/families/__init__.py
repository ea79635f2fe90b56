"""The one seam between model families: everything that differs between a decoder-only LM and an encoder-decoder.

Generation and training see a family through three calls, in the style of the Flax wmt example:

    context = encode(model, params, source)         # LM: None; encoder-decoder: the encoder output + source mask
    logits, variables = decode_step(model, variables, context, tokens, positions, segment_ids)   # one cached call
    logits = logits(model, params, batch)           # the full forward pass of a training / eval batch

and a few declarative things: the batch keys, the data kinds it trains on, what a generation's inputs are (`prompts`,
`read_text`) and the sizes its FLOP count needs. Everything outside this package asks `family_of(model)` (or
`get(config.family)`) for these instead of testing the model's class, so a third family is one new file here and
one line in FAMILIES. objective.py is the training objective over any family's batch (forward pass, loss as token
sums, hits), for the training step and the evaluations alike.
"""

from __future__ import annotations

from typing import Any, ClassVar

import flax.linen as nn
import jax.numpy as jnp


class Family:
    """What a model family must say; see decoder_lm.py and encoder_decoder.py."""

    name: ClassVar[str]
    module: ClassVar[type[nn.Module]]
    inputs: ClassVar[tuple[str, ...]]  # batch keys of the full forward pass, in the order of the module's __call__
    labels: ClassVar[tuple[str, str]]  # batch keys of the targets and of their weights
    source: ClassVar[str | None]  # batch key of the encoder's input (None: no encoder, the output continues its input)
    # True: the output continues its one input sequence (an LM: it may slide past the context, lm-eval can score
    # it, its attention is one map); False: the output is a new sequence read from a source (encoder-decoder)
    continues_prompt: ClassVar[bool]
    data_kinds: ClassVar[dict[str, str]]  # config.data.kind -> the form of the examples it builds (txjax.unread)

    def encode(self, model, params, source: tuple | None) -> Any:
        """The context every decode_step reads, from (source ids [B, S] right-padded, lengths [B]) or None."""
        raise NotImplementedError

    def decode_step(self, model, variables, context, tokens_CxL, positions_CxL, segment_ids_CxL=None, prefill=False):
        """One cached call appending L tokens: -> (logits [C, L, V], mutated variables with the new 'cache').
        prefill: the generation's first call (the one that may write what the context contributes to the cache)."""
        raise NotImplementedError

    def logits(self, model, params, batch, **apply_kwargs):
        """The full forward pass of a batch -> logits [B, L, V] (apply_kwargs: deterministic, rngs)."""
        return model.apply({"params": params}, *(batch[k] for k in self.inputs), **apply_kwargs)

    def prompts(self, inputs: list, bos_id: int | None) -> tuple[list, list | None]:
        """(prompts, sources or None) of `generate`'s inputs: what the decoder continues, and what it encodes."""
        raise NotImplementedError

    def read_text(self, tokenizer, text: str, *, bos: bool = False) -> tuple[list[int], str]:
        """(the ids `generate` takes for `text`, the text its outputs continue); bos: a synthetic LM's BOS first."""
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


def init_params(model, key, boxed: bool = False):
    """Float32 parameters from model.init on a dummy [1, 1] batch of the family's inputs, unboxed from their
    logical-axis metadata unless `boxed` (to derive shardings from; their shapes do not depend on the length)."""
    dummies = [jnp.ones((1, 1), jnp.int32) for _ in family_of(model).inputs]  # token 1 at position 1, segment 1
    params = model.init(key, *dummies)["params"]
    return params if boxed else nn.meta.unbox(params)


def batch_lengths(family: Family, batch) -> tuple[int, int, int]:
    """(rows B, source length S (0 without an encoder), target length T) of a training batch."""
    decoder_input = next(k for k in family.inputs if k != family.source)  # labels may be absent (shapes only)
    b, t = batch[decoder_input].shape
    return b, batch[family.source].shape[1] if family.source else 0, t
