"""config.data's schema: DataConfig, one field per setting (txjax.fields), made once from the validated
section. Which data kind reads a field is its `read_by` on "data.form": the form its family reads data.kind in
(txjax.data.kinds.KINDS; a synthetic task is read as 'lm' or 'seq2seq', shards as 'shards' or 'shards of pairs').
"""

from __future__ import annotations

import dataclasses

from txjax.data.kinds import KINDS
from txjax.data.tokenizers import TOKENIZER_KINDS
from txjax.fields import ReadBy, at_least, setting, within

_SYNTHETIC = ("lm", "seq2seq")  # a synthetic task's forms; its vocabulary is its own
_PAIRS = ("parallel", "shards of pairs")


def _forms(*forms: str) -> tuple[ReadBy, ...]:
    return (ReadBy("data.form", forms, ""),)  # its why: what the form reads (txjax.unread)


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """config.data (README.md, "Experiments"): what batch k is; a resumed run may change the evaluation's sets
    only."""

    kind: str = setting("synthetic", choices=KINDS, resume=False)  # its names (a kind added later too)
    # text / parallel training file, or the shards folder; relative: see txjax.config.resolve_data_path
    path: str = setting("", resume=False, read_by=_forms("text", "parallel", "chat", "shards", "shards of pairs"))
    valid_path: str = setting("", read_by=_forms("parallel"))  # parallel: validation TSV
    test_path: str = setting("", read_by=_forms("parallel"))  # parallel: test TSV
    # synthetic: copy | reverse | sort | add | passkey (max_digits: its context)
    task: str = setting("reverse", resume=False, read_by=_forms(*_SYNTHETIC))
    min_digits: int = setting(1, bounds=at_least(1), resume=False, read_by=_forms(*_SYNTHETIC))
    max_digits: int = setting(8, bounds=at_least(1), resume=False, read_by=_forms(*_SYNTHETIC))
    eval_size: int = setting(512, bounds=at_least(1), read_by=_forms(*_SYNTHETIC))  # examples in valid (and test)
    # char | byte | sentencepiece (byte_bpe, hf: from a workdir, run.py import) | task (a synthetic task's own).
    # Shards bring their own tokenizer, yet a shards run may name one: experiments/shakespeare_shards.py inherits
    # shakespeare_char's 'char', which tokenizer/built_with.json records
    tokenizer: str = setting(
        "task",
        choices=(*TOKENIZER_KINDS, "task"),
        resume=False,
        read_by=_forms("text", "parallel", "chat", "shards", "shards of pairs"),
    )
    vocab_size: int = setting(
        8000,
        bounds=at_least(1),
        resume=False,
        read_by=(
            *_forms("text", "parallel"),
            ReadBy("data.tokenizer", ("sentencepiece",), "only sentencepiece is trained to a vocabulary size"),
        ),
    )
    # tokens a window (text, shards), a row of conversations (chat)
    seq_len: int = setting(64, bounds=at_least(1), resume=False, read_by=_forms("text", "chat", "shards"))
    # text: the last 10% of the file is the valid split (nanoGPT); chat: conversations by hash (txjax.data.chat)
    val_fraction: float = setting(
        0.1, bounds=within(0, 1, open_lo=True, open_hi=True), resume=False, read_by=_forms("text", "chat")
    )
    max_src_len: int = setting(128, bounds=at_least(1), resume=False, read_by=_forms(*_PAIRS))
    max_tgt_len: int = setting(128, bounds=at_least(1), resume=False, read_by=_forms(*_PAIRS))
    # parallel: several pairs per row; shards, chat: documents packed (no attention across)
    pack: bool = setting(False, resume=False, read_by=_forms("parallel", "chat", "shards", "shards of pairs"))
