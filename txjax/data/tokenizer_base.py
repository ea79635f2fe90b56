"""The tokenizer protocol every kind implements (txjax/data/tokenizers.py, hf_tokenizer.py), and how one is saved:
a directory holding `tokenizer.json` ({"kind": ..., the kind's own fields}) and the kind's files."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from txjax.data.files import PathLike

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_DIR = "tokenizer"  # the folder a workdir or a prepared data folder keeps its tokenizer in


class Tokenizer:
    """Base class: subclasses define vocab_size, pad/bos/eos ids, encode_array, decode and _config."""

    kind: str
    vocab_size: int
    pad_id: int | None = None
    bos_id: int | None = None
    eos_id: int | None = None

    def encode_array(self, text: str) -> np.ndarray:
        raise NotImplementedError

    def decode(self, ids: Sequence[int]) -> str:
        raise NotImplementedError

    def encode(self, text: str) -> list[int]:
        return self.encode_array(text).tolist()

    def around(self) -> tuple[list[int], list[int]]:
        """(before, after): the ids put around one text read whole (an encoder's source), as the tokenizer's own
        `tokenizer(text)` writes it. txjax's own tokenizers end it with EOS, as their training pairs are written
        (txjax.data.parallel), and put nothing before; a pretrained model's says what its tokenizer adds
        (hf_tokenizer.py)."""
        return [], ([] if self.eos_id is None else [self.eos_id])

    def encode_with_specials(self, text: str) -> list[int]:
        """The text's ids between around()'s: transformers' tokenizer(text).input_ids for an imported model, the
        source of a training pair for txjax's own tokenizers."""
        before, after = self.around()
        return [*before, *self.encode(text), *after]

    def prefix(self) -> list[int]:
        """Ids the model expects before a text it continues or scores (a pretrained model's BOS): around()'s
        before; none for txjax's own tokenizers. (What goes after is no LM prompt's: it continues the text.)"""
        return self.around()[0]

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """A conversation in the model's chat template (pretrained models' tokenizers have one)."""
        raise ValueError(f"a {self.kind} tokenizer has no chat template: drop --chat")

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [self.encode_array(t) for t in texts]

    def _config(self, directory: Path) -> dict:
        """Writes the kind's own files into `directory`; returns the rest of tokenizer.json."""
        raise NotImplementedError

    def save(self, directory: PathLike) -> Path:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        config = {"kind": self.kind, **self._config(d)}
        (d / TOKENIZER_FILE).write_text(json.dumps(config, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        return d

    def _check_ids(self, ids: Sequence[int]) -> np.ndarray:
        a = np.asarray(ids, dtype=np.int64).reshape(-1)
        bad = (a < 0) | (a >= self.vocab_size)
        if bad.any():
            raise ValueError(
                f"token id {int(a[bad][0])} is outside this {self.kind} tokenizer's vocab [0, {self.vocab_size})"
            )
        return a
