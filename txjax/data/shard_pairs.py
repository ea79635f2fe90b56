"""Prepared TSV pairs (`run.py prepare --input=*.tsv`) as encoder-decoder batches, read from the shards.

A ParallelDataset whose pairs stay on disk: the same rows (source = src[:max_src_len - 1] + EOS, or an imported
model's tokenizer's specials around it; target = tgt[:max_tgt_len - 1] + EOS; with pack=True several pairs
first-fit packed per row) and the same evaluation (every pair once, in file order), but each pair is read from the
shards when a batch needs it and the shuffled order of training batch k comes from grain (a fresh permutation per
epoch, no permutation array in memory). Batch k is a pure function of (seed, k); a process reads only its rows.
References for BLEU are the targets decoded.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import grain
import numpy as np

from txjax.data.batching import require_ids
from txjax.data.parallel import ParallelDataset
from txjax.data.shards import TokenStream, check_shards_tokenizer, read_index
from txjax.data.tokenizer_base import Tokenizer


class _Truncated:
    """One side of the pairs: pair i as before + tokens[:max_len - len(before) - len(after)] + after (a target's:
    tokens[:max_len - 1] + EOS; a source's: the tokenizer's specials, parallel.encode_truncated), read when indexed
    (a sequence of arrays)."""

    def __init__(self, stream: TokenStream, max_len: int, around: tuple[list[int], list[int]]):
        self.stream = stream
        self.before, self.after = (np.asarray(ids, np.int32) for ids in around)
        self.full_E = np.diff(stream.doc_starts)
        self.kept_E = np.minimum(self.full_E, max(max_len - len(self.before) - len(self.after), 0))
        self.lengths_E = self.kept_E + len(self.before) + len(self.after)

    def __len__(self) -> int:
        return len(self.lengths_E)

    def __getitem__(self, i: int) -> np.ndarray:
        start = int(self.stream.doc_starts[i])
        return np.concatenate([self.before, self.stream.read(start, start + int(self.kept_E[i])), self.after])

    def __iter__(self) -> Iterator[np.ndarray]:
        return (self[i] for i in range(len(self)))

    def untruncated(self, i: int) -> np.ndarray:
        start = int(self.stream.doc_starts[i])
        return self.stream.read(start, start + int(self.full_E[i]))


class ShardPairsDataset(ParallelDataset):
    """One split of a prepared folder of pairs; .batch(seed, k, batch_size, rows) and .eval_batches(batch_size)."""

    def __init__(
        self,
        directory: str | os.PathLike,
        tokenizer: Tokenizer,
        max_src_len: int = 128,
        max_tgt_len: int = 128,
        split: str = "train",
        pack: bool = False,
    ):
        self.path = Path(directory).expanduser().resolve()
        index = read_index(self.path)
        if index["kind"] != "pairs":
            raise ValueError(
                f"{self.path} holds LM documents, not TSV pairs: train on them with --config.family=decoder_lm"
            )
        check_shards_tokenizer(self.path, index, tokenizer)
        self.src_tokenizer = self.tgt_tokenizer = tokenizer
        self.max_src_len, self.max_tgt_len, self.pack = max_src_len, max_tgt_len, pack
        self.pad_id, self.bos_id, eos_id = require_ids(tokenizer, "pad_id", "bos_id", "eos_id")
        self.sources = _Truncated(TokenStream(self.path, index, split, "src"), max_src_len, tokenizer.around())
        self.targets = _Truncated(TokenStream(self.path, index, split, "tgt"), max_tgt_len, ([], [eos_id]))
        cut = lambda side: side.kept_E < side.full_E
        self.num_truncated = int((cut(self.sources) | cut(self.targets)).sum())
        self.lengths_Ex2 = np.stack([self.sources.lengths_E, self.targets.lengths_E], axis=1)
        mean_src, mean_tgt = self.lengths_Ex2.mean(axis=0)
        self.pairs_per_row = max(1.0, 0.9 * min(max_src_len / mean_src, max_tgt_len / mean_tgt))
        self._orders: dict[int, grain.MapDataset] = {}

    def _stream(self, seed: int, start: int, count: int) -> np.ndarray:
        """Pair indices at positions [start, start + count) of grain's shuffled order (epoch after epoch)."""
        seed %= 2**32  # grain's seeds are 32-bit
        if seed not in self._orders:
            self._orders[seed] = grain.MapDataset.range(len(self)).shuffle(seed=seed)
        order = self._orders[seed]
        return np.array([order[j] for j in range(start, start + count)], np.int64)

    def raw_pairs(self) -> Iterator[tuple[str, str]]:
        """(source, reference) texts decoded from the untruncated tokens, in file order."""
        decode = self.tgt_tokenizer.decode
        return ((decode(self.sources.untruncated(i)), decode(self.targets.untruncated(i))) for i in range(len(self)))
