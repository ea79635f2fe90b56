"""The one seam between model families: everything that differs between a decoder-only LM, an encoder-decoder and a
prefix LM (prefix_lm.py: one stack over [source ; target], the source read both ways).

Generation and training see a family through three calls, in the style of the Flax wmt example:

    context = encode(model, params, source)         # LM: None; encoder-decoder: the encoder output + source mask;
                                                    # prefix LM: the sources' lengths
    logits, variables = decode_step(model, variables, context, tokens, positions, segment_ids)   # one cached call
    logits = logits(model, params, batch)           # the full forward pass of a training / eval batch

(the contract: `Family` in family.py) and a few declarative things: the batch keys, the data kinds it trains
on, what a generation's inputs are (`prompts`, `read_text`) and the sizes its FLOP count needs. Everything outside
this package asks `family_of(model)` (or `get(config.family)`) for these instead of testing the model's class (the
dataset in the family's example form, its longest sequence and a generation's room: `dataset`, `longest`,
`max_new_tokens`), so a family is one new file here and one line in FAMILIES (prefix_lm.py: that file, and its mask
in txjax/model/masks.py). objective.py is the training objective over any family's
batch (forward pass, loss as token sums, hits), for the training step and the evaluations alike.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from txjax.families.decoder_lm import DecoderLMFamily
from txjax.families.encoder_decoder import EncoderDecoderFamily
from txjax.families.family import Family
from txjax.families.prefix_lm import PrefixLMFamily
from txjax.model.roles import roles_of

FAMILIES: dict[str, Family] = {f.name: f for f in (DecoderLMFamily(), EncoderDecoderFamily(), PrefixLMFamily())}
_BY_MODULE = {f.module: f for f in FAMILIES.values()}
DECODER_LM, ENCODER_DECODER = FAMILIES["decoder_lm"], FAMILIES["encoder_decoder"]  # the two checkpoints come in


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


@functools.cache
def param_roles(model):
    """The tree of each parameter's role (txjax.model.roles), as the modules declared them, from shapes alone."""
    return roles_of(jax.eval_shape(lambda: init_params(model, jax.random.key(0), boxed=True)))


def batch_lengths(family: Family, batch) -> tuple[int, int, int]:
    """(rows B, source length S (0 without an encoder), target length T) of a training batch."""
    decoder_input = next(k for k in family.inputs if k != family.source)  # labels may be absent (shapes only)
    b, t = batch[decoder_input].shape
    return b, batch[family.source].shape[1] if family.source else 0, t
