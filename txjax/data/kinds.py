"""The data kinds (config.data.kind): how each builds one split's dataset. A new kind is its dataset's module, one
entry in KINDS, the form its families read it in (Family.data_kinds) and that form's name in the `read_by` of the
config.data fields it reads (txjax.sections.data.DataConfig; txjax.unread refuses the rest).

A kind builds each form its families read it in (Family.data_kinds: a synthetic task's 'lm' or 'seq2seq', shards'
documents or 'shards of pairs'); a builder `(data, split, form, tokenizer, path)` gets the config's data section, the
split, the form, the run's tokenizer and `path()`, the split's file or the kind's folder (resolved by
txjax.experiment, where the config's paths are known).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from txjax.data.chat import ChatDataset
from txjax.data.parallel import ParallelDataset
from txjax.data.shard_pairs import ShardPairsDataset
from txjax.data.shards import ShardLMDataset, load_shards_tokenizer
from txjax.data.synthetic import SyntheticTask
from txjax.data.text import TextLMDataset
from txjax.data.tokenizer_base import Tokenizer
from txjax.errors import ConfigError

_EVAL_SEEDS = {"train": 2**31 - 3, "valid": 2**31 - 1, "test": 2**31 - 2}  # synthetic eval sets


Form = Callable[..., Any]  # one form of a kind's examples: (data section, split, form, tokenizer, path) -> dataset


@dataclass(frozen=True)
class DataKind:
    """What one config.data.kind needs and builds."""

    forms: dict[str, Form]  # by the form a family reads it in (Family.data_kinds)
    # what data.path names: None (nothing: the kind makes its examples), "file" (one file, the valid split cut from
    # it by data.val_fraction), "files" (the train split's; valid_path and test_path the others'), "folder"
    files: str | None
    tokenizer: Callable[[Any], Tokenizer] | None = None  # its own tokenizer, from the path (else data.tokenizer's)
    pairs: bool = False  # its examples are (source, target) pairs: a char tokenizer built on it has pad/bos/eos
    bos_first: bool = False  # its LM sequences start with BOS: so does a generation's prompt
    exact_match: bool = False  # its evaluation is exact match of generated answers (a synthetic task)
    translates: bool = False  # its test and valid splits are decoded with config.decode (BLEU, chrF)
    windows: bool = False  # its LM rows are data.seq_len windows (ring attention splits them into 2n chunks)


def _synthetic(d, split, form, tokenizer, path):
    return SyntheticTask(d.task, form, d.min_digits, d.max_digits, d.eval_size, _EVAL_SEEDS[split], split)


def _two_splits(split: str, advice: str) -> None:
    if split == "test":
        raise ConfigError(advice)


def _text(d, split, form, tokenizer, path):
    _two_splits(split, "a text corpus has train and valid splits only (config.data.val_fraction)")
    return TextLMDataset(path(), tokenizer, d.seq_len, split, d.val_fraction)


def _parallel(d, split, form, tokenizer, path):
    pack = d.pack and split == "train"  # packing changes no eval sum, so the evaluations read one pair a row
    return ParallelDataset(path(), tokenizer, max_src_len=d.max_src_len, max_tgt_len=d.max_tgt_len, pack=pack)


def _chat(d, split, form, tokenizer, path):
    """Conversations, the loss on the assistant's tokens (txjax.data.chat); valid split off by conversation."""
    _two_splits(split, "conversations have train and valid splits only (config.data.val_fraction)")
    return ChatDataset(path(), tokenizer, d.seq_len, split, d.val_fraction, pack=d.pack)


def _shard_documents(d, split, form, tokenizer, path):
    _two_splits(split, "prepared shards have train and valid splits only (prepare --valid_fraction)")
    return ShardLMDataset(path(), tokenizer, d.seq_len, split, pack=d.pack)


def _shard_pairs(d, split, form, tokenizer, path):
    """An encoder-decoder's TSV pairs; as ParallelDataset, packed in training only."""
    _two_splits(split, "prepared shards have train and valid splits only (prepare --valid_fraction)")
    return ShardPairsDataset(path(), tokenizer, d.max_src_len, d.max_tgt_len, split, d.pack and split == "train")


KINDS = {
    "synthetic": DataKind({"lm": _synthetic, "seq2seq": _synthetic}, files=None, bos_first=True, exact_match=True),
    "text": DataKind({"text": _text}, files="file", windows=True),
    "parallel": DataKind({"parallel": _parallel}, files="files", pairs=True, translates=True),
    "chat": DataKind({"chat": _chat}, files="file"),
    "shards": DataKind(
        {"shards": _shard_documents, "shards of pairs": _shard_pairs},  # a decoder LM's documents; TSV pairs
        files="folder",
        tokenizer=load_shards_tokenizer,
        windows=True,
    ),
}
