"""The prefix-LM family (Raffel et al. 2020, T5's "prefix LM"; Tay et al. 2022, UL2's S-denoiser): one decoder-only
stack over [source ; target], bidirectional attention inside the source and causal attention after it
(masks.prefix_mask), the loss on the target only. It reads the encoder-decoder's parallel data: each pair batch is
rewritten into one sequence per row (prefix_batch), packed rows included (segment ids keep documents apart).
`model.prefix_attention=causal` reads the source causally too: the decoder-only LM over [source ; target] that
T5's architecture comparison calls "LM" (the same parameters and data; only the mask differs).

Generation's prompt is the source then BOS; the prefill writes the source's keys and values as the bidirectional
forward pass computes them (the KV cache's own mask is causal by position, so that call widens it by the prompt's
prefix mask: _prefill_reads_whole_source), and every later step is an LM's cached step, causal over the cache.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from txjax.errors import ConfigError
from txjax.families.encoder_decoder import pair_lengths
from txjax.families.family import Family
from txjax.model.config import ModelConfig
from txjax.model.masks import prefix_mask, segment_mask
from txjax.model.models import Embedder, Stack
from txjax.model.multi_head import MultiHeadAttention
from txjax.model.replaceable import Layout


def unsupported(model) -> str | None:
    """The one line refusing a model setting (of a ModelConfig or a config's model section) the prefix LM cannot run,
    or None: a local window (the stack is not causal, so every layer would run global: refused, not ignored), linear
    layers (a recurrence reads causally) or blockwise attention (the prefix makes its mask dense, which blockwise
    attention does not read)."""
    if model.attention_window:
        return (
            f"config.model.attention_window={model.attention_window}: family prefix_lm has no local attention (its "
            "source is read both ways): set model.attention_window=0"
        )
    if "L" in model.layer_types:
        return (
            f"config.model.layer_types={model.layer_types!r}: family prefix_lm reads its source both ways, which a "
            "linear (recurrent) layer cannot: set model.layer_types='' or family=decoder_lm"
        )
    if model.attention_impl == "blockwise":
        return (
            "config.model.attention_impl='blockwise': family prefix_lm attends with a dense mask (its prefix), which "
            "blockwise attention does not read: set model.attention_impl=reference (or auto)"
        )
    return None


class PrefixLM(nn.Module):
    """[source ; target] tokens [B, L] -> logits [B, L, vocab] (float32); `prefix` [B, L] (1 on source tokens) marks
    the bidirectional part of each segment. The parameters are a DecoderLM's ('embed', 'decoder')."""

    cfg: ModelConfig
    sow_weights: bool = False

    @nn.compact
    def __call__(self, tokens_BxL, positions=None, segment_ids=None, prefix=None, *, deterministic=True, decode=False):
        cfg = self.cfg
        if (refused := unsupported(cfg)) is not None:  # the config refused it already; the Python API here
            raise ValueError(refused)
        ones = jnp.ones(tokens_BxL.shape, jnp.int32)
        pos_BxL = jnp.cumsum(ones, axis=1) - 1 if positions is None else positions
        seg_BxL = ones if segment_ids is None else segment_ids
        causal = prefix is None or cfg.prefix_attention == "causal"  # causal: a decoder-only LM over the row
        prefix_BxL = jnp.zeros(tokens_BxL.shape, bool) if causal else prefix.astype(bool)
        embedder = Embedder(cfg, name="embed")
        x_BxLxD = nn.Dropout(cfg.dropout)(embedder(tokens_BxL, pos_BxL), deterministic=deterministic)
        mask = segment_mask(seg_BxL, seg_BxL) & prefix_mask(pos_BxL, pos_BxL, prefix_BxL, prefix_BxL)
        stack = Stack(cfg, cfg.num_layers, sow_weights=self.sow_weights, name="decoder")  # the order is in the mask
        return embedder.logits(stack(x_BxLxD, {"mask": mask, "pos": pos_BxL}, deterministic, decode))


def prefix_batch(pairs: dict) -> dict:
    """A seq2seq batch (src [B, S], tgt_* [B, T]; txjax.data.batching.seq2seq_batch) -> prefix-LM rows [B, S + T]:
    inputs [src ; tgt_inputs], targets and weights on the target part only, each document's target positions
    following its source's, `prefix` 1 on source tokens."""
    src_seg, tgt_seg = pairs["src_segment_ids"], pairs["tgt_segment_ids"]
    src_lengths_BxT = (src_seg[:, None, :] == tgt_seg[:, :, None]).sum(-1) * (tgt_seg > 0)  # its document's source
    cat = lambda a, b: np.concatenate([a, b], axis=1)
    return {
        "inputs": cat(pairs["src"], pairs["tgt_inputs"]),
        "positions": cat(pairs["src_positions"], pairs["tgt_positions"] + src_lengths_BxT).astype(np.int32),
        "segment_ids": cat(src_seg, tgt_seg),
        "prefix": cat(src_seg > 0, np.zeros(tgt_seg.shape, bool)).astype(np.int32),
        "targets": cat(np.zeros_like(pairs["src"]), pairs["tgt_targets"]),
        "weights": cat(np.zeros(src_seg.shape, np.float32), pairs["tgt_weights"]),
    }


class PrefixLMDataset:
    """A pairs dataset whose batches are prefix_batch's; everything else (sources, references, lengths) is the
    pairs dataset's."""

    def __init__(self, pairs):
        self.pairs = pairs

    def __getattr__(self, name):
        return getattr(self.__dict__["pairs"], name)

    def __len__(self) -> int:
        return len(self.pairs)

    def batch(self, *args, **kwargs) -> dict:
        return prefix_batch(self.pairs.batch(*args, **kwargs))

    def eval_batches(self, *args, **kwargs):
        return map(prefix_batch, self.pairs.eval_batches(*args, **kwargs))


def _prefill_reads_whole_source(own, module, k_new, v_new, q_pos, k_pos, mask, window=0):
    """During the prefill (the cache empty, so slot i holds prompt token i), each self-attention's mask over the
    cache is widened by the prompt's own mask (segments & prefix_mask): the cache's is causal by position, which
    would hide a source token's later source tokens from it."""
    keys, values, k_pos, cache_mask = own(k_new, v_new, q_pos, k_pos, mask, window)
    n = mask.shape[-1]
    return keys, values, k_pos, cache_mask.at[..., :n].set(cache_mask[..., :n] | mask)


PREFILL = Layout("prefix_lm's prefill", {(MultiHeadAttention, "update_cache"): _prefill_reads_whole_source})


class PrefixLMFamily(Family):
    name = "prefix_lm"
    module = PrefixLM
    inputs = ("inputs", "positions", "segment_ids", "prefix")
    labels = ("targets", "weights")
    source = None  # no encoder: one stack over the whole row
    data_kinds = {"parallel": "parallel", "synthetic": "seq2seq", "shards": "shards of pairs"}

    def check(self, config):
        """The model settings it cannot run (unsupported), and a chunked prefill: the whole source is read in one
        call (decode_step), so decode.prefill_chunk is refused here rather than when a split is decoded."""
        if (refused := unsupported(config.model)) is not None:
            raise ConfigError(refused)
        if chunk := config.decode.get("prefill_chunk", 0):
            raise ConfigError(
                f"config.decode.prefill_chunk={chunk}: family prefix_lm reads its whole source in one prefill (the "
                "source is read both ways): set decode.prefill_chunk=0"
            )

    def dataset(self, built):
        return PrefixLMDataset(built)

    def longest(self, data, dataset):
        return sum(pair_lengths(data, dataset.pairs))

    def max_new_tokens(self, cfg, longest_input):
        return cfg.max_len - longest_input  # the prompt is the source and BOS; the last new token is never fed

    def encode(self, model, params, source):
        """The sources' lengths [B]: each prompt's prefix (the prompt is the source, then BOS); None without sources
        (a cache made from shapes alone: txjax.ops.summary; `generate` always has them, from `prompts`)."""
        return None if source is None else source[1]

    def decode_step(self, model, variables, context, tokens_CxL, positions_CxL, segment_ids_CxL=None, prefill=False):
        if not prefill and tokens_CxL.shape[1] > 1:
            raise ValueError("family prefix_lm reads its whole source in one prefill: set decode.prefill_chunk=0")
        shapes_only = positions_CxL is None or context is None
        prefix_CxL = None if shapes_only else (positions_CxL < context[:, None]).astype(jnp.int32)
        args = (tokens_CxL, positions_CxL, segment_ids_CxL, prefix_CxL)
        return model.apply(variables, *args, decode=True, mutable=["cache"])

    def around_cached_call(self, prefill):
        return PREFILL.installed() if prefill else super().around_cached_call(prefill)

    def prompts(self, inputs, bos_id):
        """The source then BOS, continued by the target; the sources give each prompt's prefix length."""
        if bos_id is None:
            raise ValueError("a prefix LM's targets start from BOS: give bos_id")
        return [[*source, bos_id] for source in inputs], list(inputs)

    def attention_example(self, ids, target_ids):
        """[source ; decoder inputs] as one row, the source its prefix: one map over the row."""
        if not target_ids:
            raise ValueError("a prefix LM needs target_ids (the inputs after the source, starting with BOS)")
        row, n = [*ids, *target_ids], len(ids)
        inputs = [row, range(len(row)), [1] * len(row), [1] * n + [0] * len(target_ids)]
        return [np.asarray([x], np.int32) for x in inputs], {"decoder/self_attention": ("", "row", "row")}

    def attention_layers(self, cfg):
        return 0, cfg.num_layers, 0

    def head_table(self, cfg):
        return "embed"
