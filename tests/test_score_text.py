"""`run.py eval --text` reads, tokenizes and scores a file piece by piece: the pieces encode to the whole text's
tokens for every kind of tokenizer, and the streamed score is the whole-text score, number for number."""

import jax.numpy as jnp
import numpy as np
import pytest
from test_decode import random_params

from txjax.config import base_config
from txjax.data import ByteTokenizer, CharTokenizer, SentencePieceTokenizer
from txjax.data.files import text_pieces
from txjax.data.text import encode_pieces
from txjax.evaluate.score_text import score_text, score_tokens
from txjax.experiment import TrainedRun
from txjax.model.config import ModelConfig
from txjax.model.models import DecoderLM

# blank lines, indentation, punctuation before a newline, spaces before and after, digits, non-ASCII
TEXT = "".join(
    f"Line {i}: the quick brown fox{'!' * (i % 3)}\n{'  ' * (i % 2)}jumps over {i * 37} dogs — ça va?\n\n"
    for i in range(40)
)


def tokenizers_of_every_kind():
    yield ByteTokenizer()
    yield CharTokenizer.from_text(TEXT)
    yield SentencePieceTokenizer.train(TEXT.splitlines(), vocab_size=60)
    try:
        import tokenizers
    except ImportError:
        return
    from txjax.data.hf_tokenizer import HFTokenizer

    pre = tokenizers.pre_tokenizers
    for pre_tokenizer in (  # GPT-2's byte-level regex; a leading "▁" on the text's start only (SentencePiece's)
        pre.ByteLevel(add_prefix_space=False),
        pre.Sequence([pre.Split("\n", "isolated"), pre.Metaspace(replacement="▁", prepend_scheme="first")]),
    ):
        tok = tokenizers.Tokenizer(tokenizers.models.BPE())
        tok.pre_tokenizer = pre_tokenizer
        trainer = tokenizers.trainers.BpeTrainer(
            vocab_size=300, initial_alphabet=sorted(set(TEXT)), show_progress=False
        )
        tok.train_from_iterator([TEXT], trainer)
        yield HFTokenizer(tok)


@pytest.mark.parametrize("tokenizer", list(tokenizers_of_every_kind()), ids=lambda t: t.kind)
def test_pieces_encode_to_the_whole_texts_tokens(tokenizer, tmp_path):
    path = tmp_path / "text.txt"
    path.write_text(TEXT, encoding="utf-8")
    pieces = list(text_pieces(path, piece_chars=50))
    assert len(pieces) >= 20 and "".join(pieces) == TEXT
    encoded = list(encode_pieces(tokenizer, pieces))
    assert len(encoded) == len(pieces)  # no token spans a cut: each piece's tokens final when the next one comes
    streamed = np.concatenate(encoded)
    np.testing.assert_array_equal(streamed, tokenizer.encode_array(TEXT))


def test_a_file_without_a_cut_is_one_piece(tmp_path):
    path = tmp_path / "one_line.txt"
    path.write_text("word " * 100 + "\n\n  \n", encoding="utf-8")
    assert list(text_pieces(path, piece_chars=8)) == [path.read_text()]


def test_a_token_across_a_cut_joins_the_pieces(tmp_path):
    """A tokenizer whose tokens span a line end (BPE without a pre-tokenizer): the pieces around such a cut are
    encoded as one, and the tokens are still the whole text's."""
    tokenizers = pytest.importorskip("tokenizers")
    from txjax.data.hf_tokenizer import HFTokenizer

    text = "ab\ncd\n" * 20 + "ab"
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.train_from_iterator([text], tokenizers.trainers.BpeTrainer(vocab_size=12, show_progress=False))
    tokenizer = HFTokenizer(tok)
    assert len(tokenizer.encode(text)) < text.count("\n")  # its tokens span line ends
    path = tmp_path / "text.txt"
    path.write_text(text, encoding="utf-8")
    pieces = list(text_pieces(path, piece_chars=3))
    encoded = list(encode_pieces(tokenizer, pieces))
    assert len(encoded) < len(pieces)
    np.testing.assert_array_equal(np.concatenate(encoded), tokenizer.encode_array(text))


def test_a_byte_that_is_not_utf8_is_named_by_line_and_offset_in_any_block(tmp_path):
    """The file is read a block at a time, also to find a bad byte: a character cut by a block's end is no error."""
    path = tmp_path / "latin1.txt"
    data = "héllo wörld\n".encode() * 5 + b"na\xefve\n"
    path.write_bytes(data)
    for block_bytes in (1, 2, 3, 7, 1 << 20):
        with pytest.raises(ValueError, match=r"latin1.txt:6: byte 0xef at offset 72 is not UTF-8"):
            _not_utf8_error(path, block_bytes)
    with pytest.raises(ValueError, match="latin1.txt:6: byte 0xef at offset 72"):
        list(text_pieces(path, piece_chars=4))


def _not_utf8_error(path, block_bytes):
    from txjax.data.files import _not_utf8

    raise _not_utf8(path, block_bytes)


@pytest.mark.parametrize("max_tokens", [0, 321])
@pytest.mark.parametrize("tokenizer", [CharTokenizer.from_text(TEXT), ByteTokenizer()], ids=lambda t: t.kind)
def test_streamed_score_equals_the_whole_texts(tokenizer, max_tokens, tmp_path):
    """The same windows in the same batches: equal losses to the last bit; characters and bytes as the whole
    scored text decodes (non-ASCII split over pieces for the byte tokenizer)."""
    path = tmp_path / "text.txt"
    path.write_text(TEXT, encoding="utf-8")
    model = DecoderLM(ModelConfig(vocab_size=tokenizer.vocab_size, d_model=32, num_heads=2, d_ff=64, max_len=16))
    run = TrainedRun(base_config(), model, tokenizer, random_params(model, jnp.zeros((1, 4), jnp.int32)), step=0)
    streamed = score_text(run, path, max_tokens=max_tokens, batch_size=3, piece_chars=40)
    ids = tokenizer.encode(TEXT)[: max_tokens + 1 if max_tokens else None]
    whole = score_tokens(model, run.params, ids, context=16, batch_size=3)
    assert {k: streamed[k] for k in whole} == whole  # exact by construction: one eval program over the same batches
    assert whole["tokens"] == len(ids) - 1
    scored = tokenizer.decode(ids[1:])
    assert (streamed["characters"], streamed["bytes"]) == (len(scored), len(scored.encode("utf-8")))
    assert streamed["nats_per_char"] == whole["loss"] * whole["tokens"] / len(scored)
