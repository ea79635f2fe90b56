"""Tokenizers: byte-level, character-level, SentencePiece subword and GPT-2 BPE, all saved as a directory.

Protocol (the `Tokenizer` base class): `.vocab_size`, `.encode(str) -> list[int]`, `.decode(ids) -> str`, `.pad_id`,
`.bos_id`, `.eos_id` (int or None), `.save(dir)`; `load_tokenizer(dir)` restores any of them. Fast paths used by
the datasets: `.encode_array(str) -> int32[N]` (a whole file at once) and `.encode_batch(list[str])`.

On disk a tokenizer is a directory holding `tokenizer.json` (`{"kind": KIND, ...}`, TOKENIZER_KINDS below)
plus the kind's own files (`spm.model` for SentencePiece, `vocab.json` + `merges.txt` for byte_bpe). `decode` drops
pad/bos/eos ids wherever they appear.
"""

from __future__ import annotations

import io
import json
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import sentencepiece as spm

from txjax.data.files import PathLike, iter_fields, resolve_path
from txjax.data.hf_tokenizer import HFTokenizer
from txjax.data.tokenizer_base import TOKENIZER_FILE, Tokenizer
from txjax.extras import require


def _split(ids: np.ndarray, lengths: list[int]) -> list[np.ndarray]:
    """The ids of texts encoded together, cut back into one array per text (context-free tokenizers only)."""
    return np.split(ids, np.cumsum(lengths)[:-1]) if lengths else []


def _unencodable(char: str, kind: str, fix: str) -> ValueError:
    return ValueError(f"character {char!r} (U+{ord(char):04X}) is not in the {kind} tokenizer's vocab; {fix}")


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes: id b for byte b (0..255), then pad=256, bos=257, eos=258; vocab_size 259."""

    kind = "byte"
    vocab_size = 259
    pad_id, bos_id, eos_id = 256, 257, 258

    def encode_array(self, text: str) -> np.ndarray:
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise _unencodable(text[e.start], "byte", "remove unpaired surrogates from the text") from None
        return np.frombuffer(data, dtype=np.uint8).astype(np.int32)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return _split(self.encode_array("".join(texts)), [len(t.encode("utf-8", "surrogatepass")) for t in texts])

    def decode(self, ids: Sequence[int]) -> str:
        a = self._check_ids(ids)
        return a[a < 256].astype(np.uint8).tobytes().decode("utf-8", errors="replace")

    def _config(self, directory: Path) -> dict:
        return {}


class CharTokenizer(Tokenizer):
    """One id per character: chars sorted by code point get ids 0..n-1 (nanoGPT's shakespeare_char `stoi`).

    With `specials=True`, pad/bos/eos get ids n, n+1, n+2; without (the default) a char LM keeps exactly n ids
    (65 on tinyshakespeare) and pad/bos/eos are None.
    """

    kind = "char"

    def __init__(self, chars: Iterable[str], specials: bool = False):
        self.chars = sorted(set(chars))
        if any(len(c) != 1 for c in self.chars):
            raise ValueError("CharTokenizer needs single characters")
        self.specials = specials
        n = len(self.chars)
        if specials:
            self.pad_id, self.bos_id, self.eos_id = n, n + 1, n + 2
        self.vocab_size = n + 3 * specials
        codes = np.array([ord(c) for c in self.chars], dtype=np.int64)
        self._ids = np.full(int(codes.max(initial=0)) + 2, -1, np.int32)  # code point -> id; -1: not in the vocab
        self._ids[codes] = np.arange(n)

    @classmethod
    def from_text(cls, text: str, specials: bool = False) -> CharTokenizer:
        return cls(set(text), specials=specials)

    def encode_array(self, text: str) -> np.ndarray:
        codes = np.frombuffer(text.encode("utf-32-le", errors="surrogatepass"), dtype=np.uint32)
        ids = self._ids[np.minimum(codes, len(self._ids) - 1)]
        if (ids < 0).any():
            char = chr(int(codes[np.argmax(ids < 0)]))
            raise _unencodable(
                char, "char", "build the CharTokenizer from text that contains it (or use the byte tokenizer)"
            )
        return ids

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return _split(self.encode_array("".join(texts)), [len(t) for t in texts])

    def decode(self, ids: Sequence[int]) -> str:
        a = self._check_ids(ids)
        return "".join(self.chars[i] for i in a[a < len(self.chars)])

    def _config(self, directory: Path) -> dict:
        return {"chars": "".join(self.chars), "specials": self.specials}


class SentencePieceTokenizer(Tokenizer):
    """A SentencePiece model (trained here with `train`/`train_from_files`); ids pad=0, unk=1, bos=2, eos=3.

    Text that maps to the unk piece raises ValueError instead (train with byte_fallback=True to never have unk).
    """

    kind = "sentencepiece"
    MODEL_FILE = "spm.model"

    def __init__(self, model_proto: bytes):
        self.model_proto = model_proto
        self.sp = spm.SentencePieceProcessor(model_proto=model_proto)
        self.vocab_size = self.sp.get_piece_size()
        self.unk_id = self.sp.unk_id()
        self.pad_id, self.bos_id, self.eos_id = (
            i if i >= 0 else None for i in (self.sp.pad_id(), self.sp.bos_id(), self.sp.eos_id())
        )

    @classmethod
    def train(
        cls,
        sentences: Iterable[str],
        vocab_size: int,
        *,
        model_type: str = "unigram",
        character_coverage: float = 1.0,
        byte_fallback: bool = False,
        max_sentences: int = 0,
        num_threads: int | None = None,
        source: str = "this text",
    ) -> SentencePieceTokenizer:
        """Trains in memory on an iterable of sentences (one per item; max_sentences=0 uses all); `source` names
        them in the error for a vocab_size larger than they allow.

        Normalisation is the identity and whitespace is kept, so decode(encode(s)) == s for covered text; "\\n" is its
        own piece, so whole files (a text LM corpus) round-trip too.
        """
        model = io.BytesIO()
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(sentences),
                model_writer=model,
                vocab_size=vocab_size,
                model_type=model_type,
                character_coverage=character_coverage,
                byte_fallback=byte_fallback,
                input_sentence_size=max_sentences,
                shuffle_input_sentence=True,
                pad_id=0,
                unk_id=1,
                bos_id=2,
                eos_id=3,
                user_defined_symbols=["\n"],
                normalization_rule_name="identity",
                remove_extra_whitespaces=False,
                minloglevel=2,
                num_threads=num_threads or os.cpu_count() or 1,
            )
        except RuntimeError as e:  # sentencepiece's check, as a traceback: "... Please set it to a value <= 28."
            most = re.search(r"value <= (\d+)", str(e))
            if most is None:
                raise
            raise ValueError(
                f"SentencePiece vocab_size {vocab_size} is more than {source} allows (at most {most[1]} pieces): "
                f"set --config.data.vocab_size={most[1]} or lower, or train on more text"
            ) from None
        return cls(model.getvalue())

    @classmethod
    def train_from_files(cls, paths: Sequence[PathLike], vocab_size: int, **kwargs) -> SentencePieceTokenizer:
        """Trains on every line of text files; a TSV line gives each of its tab-separated fields (both languages)."""
        source = ", ".join(str(resolve_path(p)) for p in paths)
        return cls.train(iter_fields(list(paths)), vocab_size, source=source, **kwargs)

    def _check_unk(self, text: str, ids: np.ndarray) -> np.ndarray:
        if (ids == self.unk_id).any():
            char = next((c for c in dict.fromkeys(text) if self.unk_id in self.sp.encode(c)), text[:20])
            raise _unencodable(
                char, "sentencepiece", "retrain the tokenizer on text that contains it, or with byte_fallback=True"
            )
        return ids

    def encode_array(self, text: str) -> np.ndarray:
        return self._check_unk(text, np.asarray(self.sp.encode(text), dtype=np.int32))

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        out = self.sp.encode(list(texts), num_threads=os.cpu_count() or 1)
        return [self._check_unk(t, np.asarray(ids, dtype=np.int32)) for t, ids in zip(texts, out)]

    def decode(self, ids: Sequence[int]) -> str:
        return self.sp.decode(self._check_ids(ids).tolist())

    def _config(self, directory: Path) -> dict:
        (directory / self.MODEL_FILE).write_bytes(self.model_proto)
        return {"model_file": self.MODEL_FILE}


class ByteLevelBPETokenizer(Tokenizer):
    """GPT-2's byte-level BPE (Radford et al. 2019) run by Hugging Face `tokenizers` (the `interop` extra).

    Text is split by GPT-2's regex, each piece's UTF-8 bytes are mapped to printable characters and merged by
    `merges` (ordered pairs) into ids from `vocab`. `<|endoftext|>` (GPT-2: 50256), when in the vocab, is both bos and
    eos and encodes as one id; there is no pad. Saved as GPT-2's own vocab.json + merges.txt.
    """

    kind = "byte_bpe"
    VOCAB_FILE, MERGES_FILE = "vocab.json", "merges.txt"
    EOS_TOKEN = "<|endoftext|>"

    def __init__(self, vocab: dict[str, int], merges: Sequence[tuple[str, str]]):
        tokenizers = require("tokenizers", "the byte_bpe tokenizer (GPT-2's byte-level BPE)")
        self.vocab, self.merges = dict(vocab), [tuple(m) for m in merges]
        self.tok = tokenizers.Tokenizer(tokenizers.models.BPE(self.vocab, self.merges))
        self.tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
        self.tok.decoder = tokenizers.decoders.ByteLevel()
        if self.EOS_TOKEN in self.vocab:
            self.tok.add_special_tokens([tokenizers.AddedToken(self.EOS_TOKEN, special=True)])
            self.bos_id = self.eos_id = self.vocab[self.EOS_TOKEN]
        self.vocab_size = max(self.vocab.values()) + 1

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int) -> ByteLevelBPETokenizer:
        """BPE (Sennrich et al. 2016) over GPT-2's byte-level pieces, trained by Hugging Face `tokenizers`: ids 0
        `<|endoftext|>` (bos and eos), 1-256 the bytes, then the merges of the most frequent pairs, `vocab_size` in all
        (fewer when the texts allow no more merges)."""
        tokenizers = require("tokenizers", "training the bpe tokenizer")
        if vocab_size < 257:
            raise ValueError(f"--vocab_size={vocab_size}: a byte-level BPE needs at least 257 ids (256 bytes and "
                             f"{cls.EOS_TOKEN}); raise it")  # fmt: skip
        tok = tokenizers.Tokenizer(tokenizers.models.BPE())
        tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
        trainer = tokenizers.trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=[cls.EOS_TOKEN],
            initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(texts, trainer)
        model = json.loads(tok.to_str())["model"]
        merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
        return cls(model["vocab"], merges)

    @classmethod
    def from_files(cls, vocab_path: PathLike, merges_path: PathLike) -> ByteLevelBPETokenizer:
        """GPT-2's vocab.json and merges.txt (a '#version' first line is skipped)."""
        lines = Path(merges_path).read_text(encoding="utf-8").splitlines()
        merges = [tuple(line.split(" ")) for line in lines if line and not line.startswith("#version")]
        return cls(json.loads(Path(vocab_path).read_text(encoding="utf-8")), merges)

    def _check_utf8(self, text: str) -> None:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise _unencodable(text[e.start], "byte_bpe", "remove unpaired surrogates from the text") from None

    def encode_array(self, text: str) -> np.ndarray:
        self._check_utf8(text)
        return np.asarray(self.tok.encode(text).ids, dtype=np.int32)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        for text in texts:
            self._check_utf8(text)
        return [np.asarray(e.ids, dtype=np.int32) for e in self.tok.encode_batch(list(texts))]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode(self._check_ids(ids).tolist(), skip_special_tokens=True)

    def _config(self, directory: Path) -> dict:
        (directory / self.VOCAB_FILE).write_text(json.dumps(self.vocab, ensure_ascii=False), encoding="utf-8")
        merges = "".join(f"{a} {b}\n" for a, b in self.merges)
        (directory / self.MERGES_FILE).write_text("#version: 0.2\n" + merges, encoding="utf-8")
        return {"vocab_file": self.VOCAB_FILE, "merges_file": self.MERGES_FILE}


def load_tokenizer(directory: PathLike) -> Tokenizer:
    """Restores a tokenizer saved with `.save(directory)`."""
    d = Path(directory).expanduser().resolve()
    path = d / TOKENIZER_FILE
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer not found: {path} (save one there with tokenizer.save({str(d)!r}))")
    config = json.loads(path.read_text(encoding="utf-8"))
    kind = config.get("kind")
    if kind not in LOADERS:
        raise ValueError(f"{path}: unknown tokenizer kind {kind!r} (expected one of {', '.join(TOKENIZER_KINDS)})")
    return LOADERS[kind](d, config)


LOADERS = {  # a saved tokenizer.json's kind -> its loader(directory, tokenizer.json's dict)
    ByteTokenizer.kind: lambda d, config: ByteTokenizer(),
    CharTokenizer.kind: lambda d, config: CharTokenizer(config["chars"], specials=config["specials"]),
    SentencePieceTokenizer.kind: lambda d, config: SentencePieceTokenizer((d / config["model_file"]).read_bytes()),
    ByteLevelBPETokenizer.kind: lambda d, config: ByteLevelBPETokenizer.from_files(
        d / config["vocab_file"], d / config["merges_file"]
    ),
    HFTokenizer.kind: HFTokenizer.load,  # a pretrained model's own tokenizer (txjax.convert)
}
TOKENIZER_KINDS = tuple(LOADERS)  # the one list of saved tokenizer kinds (config.TOKENIZERS adds the synthetic tasks')
