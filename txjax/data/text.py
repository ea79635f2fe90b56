"""Any plain-text file as a language-modelling corpus (nanoGPT style)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator

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
        return itertools.islice(eval_windows([self.tokens], self.seq_len, batch_size), max_batches)


def eval_windows(pieces: Iterable[np.ndarray], seq_len: int, batch_size: int) -> Iterator[Batch]:
    """Evaluation batches [B, L] over the tokens that `pieces` make up, in order: non-overlapping windows that predict
    every token but the first exactly once (window w: inputs x[wL : wL + L], targets x[wL + 1 : wL + L + 1]), the last
    batch padded with weight-0 rows (segment_id 0, position 0). Holds a piece and one batch, not the whole text."""
    step = batch_size * seq_len
    rest = np.zeros(0, np.int32)
    for piece in pieces:
        rest = np.concatenate([rest, np.asarray(piece, np.int32)])
        while len(rest) > step:
            yield _windows(rest[: step + 1], seq_len, batch_size)
            rest = rest[step:]
    if len(rest) > 1:
        yield _windows(rest, seq_len, batch_size)


def _windows(x: np.ndarray, seq_len: int, batch_size: int) -> Batch:
    """One batch of eval windows over x[:B * L + 1] (padded where x is shorter)."""
    total = batch_size * seq_len
    padded = np.zeros(total + 1, np.int32)
    padded[: len(x)] = x
    flat_pos = np.arange(total)
    valid = flat_pos < len(x) - 1
    shape = (batch_size, seq_len)
    return {
        "inputs": np.where(valid, padded[:-1], 0).reshape(shape),
        "targets": np.where(valid, padded[1:], 0).reshape(shape),
        "weights": valid.astype(np.float32).reshape(shape),
        "positions": np.where(valid, flat_pos % seq_len, 0).astype(np.int32).reshape(shape),
        "segment_ids": valid.astype(np.int32).reshape(shape),
    }


def encode_pieces(tokenizer: Tokenizer, pieces: Iterable[str]) -> Iterator[np.ndarray]:
    """tokenizer.encode_array of the text that `pieces` make up (files.text_pieces), one array per piece: each piece
    after the first is encoded after the last line of the text before it, whose tokens are dropped, so that a
    tokenizer that treats a text's start apart (SentencePiece's and Llama's leading space) sees it as inside the whole.
    A piece's tokens are final once that line's own tokens start the next encoding (no token spans the cut); where
    they do not, the two pieces are encoded as one."""
    encode = tokenizer.encode_array
    context = text = ids = None
    for piece in pieces:
        if text is None:
            text, ids = piece, encode(piece)
            continue
        line = text[text.rfind("\n", 0, len(text) - 1) + 1 :]
        before, joint = encode(line), encode(line + piece)
        if np.array_equal(joint[: len(before)], before):
            yield ids
            context, text, ids = line, piece, joint[len(before) :]
        else:
            text += piece
            ids = encode(text) if context is None else encode(context + text)[len(encode(context)) :]
    if text is not None:
        yield ids
