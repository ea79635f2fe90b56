"""Any plain-text file as a language-modelling corpus (nanoGPT style)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from txjax.data.batching import Batch, batch_rng
from txjax.data.files import PathLike, read_text, resolve_path
from txjax.data.tokenizer_base import Tokenizer


class TextLMDataset:
    """One split of a text file, tokenized whole once into `self.tokens` (int32[N]).

    Split as nanoGPT: the first (1 - val_fraction) of the tokens are 'train', the rest 'valid'.
    Training batch k: B random windows of L + 1 tokens at uniform starts in [0, N - L), inputs = x[i:i+L],
    targets = x[i+1:i+L+1] (all weights 1). Evaluation: non-overlapping windows that predict every token of the
    split but the first exactly once; the last window is padded with weight 0, segment_id 0.
    """

    def __init__(
        self, path: PathLike, tokenizer: Tokenizer, seq_len: int, split: str = "train", val_fraction: float = 0.1
    ):
        if split not in ("train", "valid"):
            raise ValueError(f"split must be 'train' or 'valid', got {split!r}")
        self.path = resolve_path(path)
        self.tokenizer = tokenizer
        self.seq_len = seq_len
        self.split = split
        all_tokens = tokenizer.encode_array(read_text(self.path))
        cut = int(len(all_tokens) * (1.0 - val_fraction))
        self.tokens = all_tokens[:cut] if split == "train" else all_tokens[cut:]
        if len(self.tokens) < seq_len + 1:
            raise ValueError(
                f"{self.path}: the {split} split has {len(self.tokens)} tokens, fewer than "
                f"seq_len + 1 = {seq_len + 1}; lower --config.data.seq_len or change val_fraction"
            )

    @classmethod
    def from_tokens(cls, tokens: np.ndarray, seq_len: int) -> TextLMDataset:
        """A corpus tokenized elsewhere (txjax.evaluate.score_text scores any file with the eval windows below)."""
        dataset = cls.__new__(cls)
        dataset.path, dataset.tokenizer, dataset.seq_len, dataset.split = None, None, seq_len, "valid"
        dataset.tokens = np.asarray(tokens, np.int32)
        return dataset

    def batch(self, seed: int, k: int, batch_size: int, rows: slice = slice(None)) -> Batch:
        """Training batch k: a pure function of (seed, k); only its `rows` (one process's share) are built."""
        L = self.seq_len
        starts_R = batch_rng(seed, k).integers(0, len(self.tokens) - L, size=batch_size)[rows]
        R = len(starts_R)
        idx_RxL = starts_R[:, None] + np.arange(L)[None, :]
        ones_RxL = np.ones((R, L), np.int32)
        return {
            "inputs": self.tokens[idx_RxL],
            "targets": self.tokens[idx_RxL + 1],
            "weights": ones_RxL.astype(np.float32),
            "positions": np.broadcast_to(np.arange(L, dtype=np.int32), (R, L)).copy(),
            "segment_ids": ones_RxL,
        }

    def num_eval_batches(self, batch_size: int) -> int:
        return math.ceil(math.ceil((len(self.tokens) - 1) / self.seq_len) / batch_size)

    def eval_batches(self, batch_size: int, max_batches: int | None = None) -> Iterator[Batch]:
        """The whole split (or its first max_batches batches) in order, as fixed-shape [B, L] batches."""
        L, x = self.seq_len, self.tokens
        num_targets = len(x) - 1
        num_batches = self.num_eval_batches(batch_size)
        if max_batches is not None:
            num_batches = min(num_batches, max_batches)
        total = num_batches * batch_size * L  # windows beyond the split are whole padding rows
        padded = np.zeros(total + 1, np.int32)
        n = min(len(x), total + 1)
        padded[:n] = x[:n]
        flat_pos = np.arange(total)
        valid = flat_pos < num_targets
        shape = (num_batches, batch_size, L)
        arrays = {
            "inputs": np.where(valid, padded[:-1], 0).reshape(shape),
            "targets": np.where(valid, padded[1:], 0).reshape(shape),
            "weights": valid.astype(np.float32).reshape(shape),
            "positions": np.where(valid, flat_pos % L, 0).astype(np.int32).reshape(shape),
            "segment_ids": valid.astype(np.int32).reshape(shape),
        }
        for j in range(num_batches):
            yield {name: a[j] for name, a in arrays.items()}
