"""The contract every model family implements (Family); the families are its subclasses, registered in
txjax/families/__init__.py."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, ClassVar

import flax.linen as nn

from txjax.errors import ConfigError
from txjax.model import adapters as model_adapters


class Family:
    """What a model family must say; see decoder_lm.py and encoder_decoder.py."""

    name: ClassVar[str]
    module: ClassVar[type[nn.Module]]
    inputs: ClassVar[tuple[str, ...]]  # batch keys of the full forward pass, in the order of the module's __call__
    labels: ClassVar[tuple[str, str]]  # batch keys of the targets and of their weights
    source: ClassVar[str | None]  # batch key of the encoder's input (None: no encoder)
    data_kinds: ClassVar[dict[str, str]]  # config.data.kind -> the form it reads (built by txjax.data.KINDS)
    source_modules: ClassVar[tuple[str, ...]] = ()  # top-level modules that run once per source (FLOPs: N_enc)
    ring_attention: ClassVar[bool] = False  # whether mesh.sequence > 1 may shard its sequence (a causal stack's)

    def dataset(self, built):
        """The family's dataset over the one its data kind built (txjax.experiment.build_dataset): as it is, or its
        batches rewritten into the family's example form."""
        return built

    def longest(self, data, dataset) -> int:
        """The most positions one of the family's sequences takes (model.max_len when left at 0), from the config's
        data section and the training dataset."""
        raise NotImplementedError

    def max_new_tokens(self, cfg, longest_input: int) -> int:
        """The most tokens a generation from inputs of up to `longest_input` ids can write within cfg.max_len."""
        raise NotImplementedError

    def encode(self, model, params, source: tuple | None) -> Any:
        """The context every decode_step reads, from (source ids [B, S] right-padded, lengths [B]) or None."""
        raise NotImplementedError

    def decode_step(self, model, variables, context, tokens_CxL, positions_CxL, segment_ids_CxL=None, prefill=False):
        """One cached call appending L tokens: -> (logits [C, L, V], mutated variables with the new 'cache').
        prefill: the generation's first call (the one that may write what the context contributes to the cache)."""
        raise NotImplementedError

    def around_cached_call(self, prefill: bool):
        """A context entered around each cached call, outside the decoding layout's methods (txjax.decode.cache.extend):
        the family's txjax.model.replaceable.Layout over what those methods return (its .installed()), or none."""
        return contextlib.nullcontext()

    def logits(self, model, params, batch, adapters=None, **apply_kwargs):
        """The full forward pass of a batch -> logits [B, L, V] (apply_kwargs: deterministic, rngs), a LoRA run's
        `adapters` merged block by block (txjax.model.adapters)."""
        variables = model_adapters.variables(params, adapters)
        return model.apply(variables, *(batch[k] for k in self.inputs), **apply_kwargs)

    def scored_logits(self, model, params, tokens_BxL, positions_BxL, mask_Bx1xLxL, scored_BxC):
        """The logits [B, C, V] at the positions scored_BxC (indices into L) of one forward pass over tokens [B, L]
        at explicit positions, attending where mask [B, 1, L, L] allows (and in the causal order of the positions):
        lm-eval's log-likelihoods (txjax.evaluate.lm_eval_model, after check_scores_text)."""
        raise NotImplementedError

    def prompts(self, inputs: list, bos_id: int | None) -> tuple[list, list | None]:
        """(prompts, sources or None) of `generate`'s inputs: what the decoder continues, and what it encodes."""
        raise NotImplementedError

    # A generation's output is a new text read from a source here; an LM's continues its prompt (decoder_lm.py
    # overrides these five): its prompt is the text as it is, it may slide past the context, has no limit of its
    # own, one sequence to look at, and lm-eval scores it.
    def read_text(self, tokenizer, text: str, *, bos: bool = False) -> tuple[list[int], str]:
        """(the ids `generate` takes for `text`, the text its outputs continue; bos: a synthetic LM's BOS first):
        here the source, the text with the tokenizer's specials around it (txjax's own: then EOS, as the sources of
        training; an imported model's: as its own tokenizer writes it), and outputs that continue nothing."""
        return tokenizer.encode_with_specials(text), ""

    def slides(self, strategy: dict) -> bool:
        """Whether a generation with these Strategy fields runs past the context (txjax.decode.generate_windowed,
        its prompt cut to the last max_len tokens) rather than within it (txjax.decode.generate)."""
        return False

    def output_limit(self, cfg) -> float:
        """The most tokens any generation's output takes: a new text's own positions (max_len); inf where only its
        prompt's room bounds it (txjax.decode.check_inputs) or it slides past the context."""
        return cfg.max_len

    def attention_target(self, bos_id: int, target_ids: Callable[[], list[int]]) -> list[int] | None:
        """The decoder inputs an attention map reads beside its text (attention_example's target_ids): BOS then the
        target (target_ids(): the given one, or the model's own output), or None: the text is the one sequence."""
        return [bos_id, *target_ids()]

    def check(self, config) -> None:
        """A ConfigError for a setting of a validated config (its model and decode sections) that the family cannot
        run, naming the field and the fix (txjax.config.validate asks, before anything is written); none here."""

    def check_scores_text(self, where: str, command: str, fix: str = "") -> None:
        """A ConfigError unless `command` can score the model on a text alone (the log-likelihood of a text, or of a
        text continuing another): an encoder-decoder's or a prefix LM's output is a new text read from a source, and
        a text alone is no source. `fix`: what to run instead, ending the line."""
        raise ConfigError(f"{where} is of family {self.name}: {command} scores decoder-only LMs{fix}")

    def attention_example(self, ids: list[int], target_ids: list[int] | None) -> tuple[list, dict]:
        """One example's attention maps (txjax.evaluate.viz): (the model's positional inputs, each of batch 1; for
        each sown map '<stack>/<kind>': (the file name's suffix, the queries' labels, the keys'), the labels named
        'source' (ids), 'target' (target_ids) or 'row' (the two one after the other))."""
        raise NotImplementedError

    def attention_layers(self, cfg) -> tuple[int, int, int]:
        """(encoder self-attention, decoder self-attention, cross-attention) layer counts."""
        raise NotImplementedError

    def head_table(self, cfg) -> str:
        """The top-level module whose token table is the tied LM head."""
        raise NotImplementedError
