"""Parallel `source<TAB>target` TSV files for the encoder-decoder."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from txjax.data.batching import Batch, chunk_rows, require_ids, seq2seq_batch
from txjax.data.files import PathLike, read_tsv, resolve_path
from txjax.data.packing import first_fit
from txjax.data.tokenizer_base import Tokenizer


def encode_truncated(
    tokenizer: Tokenizer, texts: list[str], max_len: int, source: bool = False
) -> tuple[list[np.ndarray], np.ndarray]:
    """Each text as tokens[:max_len - 1] + [EOS] (at most max_len ids, always ending with EOS), and a bool[N] mask
    of the texts that were cut. A source (`source`) has the tokenizer's specials around it instead (before +
    tokens[:max_len - len(before) - len(after)] + after): an imported model's sources as its own tokenizer writes
    them (BART's <s> ... </s>), txjax's own tokenizers' as targets are (around() is then ([], [EOS]))."""
    (eos,) = require_ids(tokenizer, "eos_id")
    before, after = (np.asarray(ids, np.int32) for ids in (tokenizer.around() if source else ([], [eos])))
    room = max(max_len - len(before) - len(after), 0)
    encoded = tokenizer.encode_batch(texts)
    cut_E = np.array([len(ids) > room for ids in encoded])
    return [np.concatenate([before, ids[:room], after]).astype(np.int32) for ids in encoded], cut_E


class ParallelDataset:
    """Sentence pairs of one TSV file, tokenized once; fixed shapes [B, max_src_len] / [B, max_tgt_len].

    Truncation: source = src_tokens[:max_src_len-1] + EOS (an imported model's: its tokenizer's specials around
    them, encode_truncated), target = tgt_tokens[:max_tgt_len-1] + EOS
    (`num_truncated` counts the pairs cut). Training batch k is a pure function of (seed, k): the pair stream is a
    fresh permutation per epoch (rng (seed, epoch)), batch k reads its stretch of it. With pack=True batch k
    first-fit packs the next ceil(batch_size * pairs_per_row) pairs of the stream into B rows (segment ids 1..n,
    positions restarting at 0); pairs that fit no row are skipped (`pairs_per_row` defaults to a guess from the
    mean lengths that leaves some slack). Evaluation visits every pair exactly once, in file order.
    """

    generated_metric = "translation"  # how txjax.evaluate.split scores its decoded outputs (BLEU, chrF)

    def __init__(
        self,
        path: PathLike,
        src_tokenizer: Tokenizer,
        tgt_tokenizer: Tokenizer | None = None,
        max_src_len: int = 128,
        max_tgt_len: int = 128,
        pack: bool = False,
        pairs_per_row: float | None = None,
    ):
        self.path = resolve_path(path)
        self.src_tokenizer = src_tokenizer
        self.tgt_tokenizer = tgt_tokenizer or src_tokenizer
        self.max_src_len, self.max_tgt_len = max_src_len, max_tgt_len
        self.pack = pack
        self.pad_id, self.bos_id = require_ids(self.tgt_tokenizer, "pad_id", "bos_id")
        self.source_texts, self.target_texts = read_tsv(self.path)
        if not self.source_texts:
            raise ValueError(f"{self.path}: no sentence pairs")
        self.sources, src_cut_E = encode_truncated(src_tokenizer, self.source_texts, max_src_len, source=True)
        self.targets, tgt_cut_E = encode_truncated(self.tgt_tokenizer, self.target_texts, max_tgt_len)
        self.num_truncated = int((src_cut_E | tgt_cut_E).sum())
        self.lengths_Ex2 = np.array([[len(s), len(t)] for s, t in zip(self.sources, self.targets)])
        mean_src, mean_tgt = self.lengths_Ex2.mean(axis=0)
        self._orders: dict[tuple[int, int], np.ndarray] = {}  # a few epochs' permutations
        self.pairs_per_row = pairs_per_row or max(1.0, 0.9 * min(max_src_len / mean_src, max_tgt_len / mean_tgt))

    def __len__(self) -> int:
        return len(self.sources)

    def _epoch_order(self, seed: int, epoch: int) -> np.ndarray:
        key = (seed, epoch)
        if key not in self._orders:
            if len(self._orders) >= 4:
                self._orders.pop(next(iter(self._orders)))
            self._orders[key] = np.random.default_rng(key).permutation(len(self))
        return self._orders[key]

    def _stream(self, seed: int, start: int, count: int) -> np.ndarray:
        """Pair indices at positions [start, start + count) of the shuffled stream (epoch after epoch)."""
        epochs, offsets = np.divmod(np.arange(start, start + count), len(self))
        out = np.empty(count, dtype=np.int64)
        for epoch in np.unique(epochs):
            here = epochs == epoch
            out[here] = self._epoch_order(seed, int(epoch))[offsets[here]]
        return out

    def _batch_of_rows(self, rows) -> Batch:
        return seq2seq_batch(
            rows, self.sources, self.targets, self.max_src_len, self.max_tgt_len, self.pad_id, self.bos_id
        )

    def batch(self, seed: int, k: int, batch_size: int, rows: slice = slice(None)) -> Batch:
        """Training batch k: a pure function of (seed, k); only its `rows` (one process's share) are built."""
        if not self.pack:
            return self._batch_of_rows([[i] for i in self._stream(seed, k * batch_size, batch_size)[rows]])
        count = math.ceil(batch_size * self.pairs_per_row)
        candidates = self._stream(seed, k * count, count)
        packed = first_fit(self.lengths_Ex2[candidates], (self.max_src_len, self.max_tgt_len), max_rows=batch_size)
        packed = [[candidates[j] for j in row] for row in packed]
        return self._batch_of_rows((packed + [()] * (batch_size - len(packed)))[rows])

    def eval_batches(self, batch_size: int, packed: bool | None = None) -> Iterator[Batch]:
        """Every pair exactly once in file order (row-major; packed if `packed`, default self.pack); the last batch
        is filled with all-padding rows (weight 0)."""
        if self.pack if packed is None else packed:
            rows = first_fit(self.lengths_Ex2, (self.max_src_len, self.max_tgt_len))
        else:
            rows = [[i] for i in range(len(self))]
        for group in chunk_rows(rows, batch_size):
            yield self._batch_of_rows(group)

    def raw_pairs(self) -> Iterator[tuple[str, str]]:
        """(source text, reference text) in file order, untruncated: for BLEU against decoded eval batches."""
        return zip(self.source_texts, self.target_texts)
