"""What an imported model's tokenizer puts around a text: the record its importer writes (hf_tokenizer's `before` /
`after`: tokenizer.json's post-processor, a GGUF file's add_bos/add_eos flags; MarianTokenizer's EOS is
test_seq2seq_convert's), saved with the workdir's tokenizer and read back, gives the ids `generate` takes for a text
(Family.read_text) equal to transformers' tokenizer(text).input_ids for each converter's tokenizer kind, built here
by transformers' own tokenizer classes (their real post-processors) from tiny vocabularies; an encoder-decoder's
training sources keep them when cut, as transformers' truncation does; txjax's own tokenizers and workdirs saved
before the record read sources as they did (the text, then EOS)."""

import json

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from txjax.convert import gguf as gguf_convert  # noqa: E402
from txjax.convert import hf_folder, marian  # noqa: E402
from txjax.convert.gpt2 import load_gpt2_tokenizer  # noqa: E402
from txjax.data.parallel import ParallelDataset  # noqa: E402
from txjax.data.tokenizers import CharTokenizer, load_tokenizer  # noqa: E402
from txjax.families import FAMILIES  # noqa: E402

TEXT = "the cat sat on the mat, 42 times!"


def byte_level_vocab(specials):
    """The specials, then GPT-2's 256 byte-level characters (no merges: one id per byte)."""
    vocab = {token: i for i, token in enumerate(specials)}
    for char in sorted(tokenizers.pre_tokenizers.ByteLevel.alphabet()):
        vocab.setdefault(char, len(vocab))
    return vocab


def metaspace_pieces(specials):
    """The specials, then SentencePiece's '▁' and TEXT's characters."""
    return [*specials, "▁", *sorted(set(TEXT) - {" "})]


def seq2seq_reader(folder, ref):
    """The encoder-decoders' reader (BART's and T5's) with the ids config.json would give."""
    ids = {"decoder_start_token_id": ref.pad_token_id, "eos_token_id": ref.eos_token_id}
    return marian.read_seq2seq_tokenizer(folder, ids | {"pad_token_id": ref.pad_token_id})


# kind -> (transformers' tokenizer of that model, txjax's reader of the folder, family, what it adds around a text)
KINDS = {
    "llama": (
        lambda: transformers.LlamaTokenizer(
            vocab={p: i for i, p in enumerate(metaspace_pieces(["<unk>", "<s>", "</s>"]))},
            merges=[],
            add_bos_token=True,
        ),
        lambda folder, ref: hf_folder.read_tokenizer(folder, {}),
        "decoder_lm",
        (["<s>"], []),
    ),
    "gemma": (
        lambda: transformers.GemmaTokenizer(
            vocab={p: i for i, p in enumerate(metaspace_pieces(["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]))},
            merges=[],
            add_bos_token=True,
        ),
        lambda folder, ref: hf_folder.read_tokenizer(folder, {}),
        "decoder_lm",
        (["<bos>"], []),
    ),
    "qwen2": (
        lambda: transformers.Qwen2Tokenizer(vocab=byte_level_vocab(["<|endoftext|>"]), merges=[]),
        lambda folder, ref: hf_folder.read_tokenizer(folder, {}),
        "decoder_lm",
        ([], []),
    ),
    "gpt2": (
        lambda: transformers.GPT2Tokenizer(vocab=byte_level_vocab(["<|endoftext|>"]), merges=[]),
        lambda folder, ref: load_gpt2_tokenizer(folder),
        "decoder_lm",
        ([], []),
    ),
    "bart": (
        lambda: transformers.BartTokenizer(
            vocab=byte_level_vocab(["<s>", "<pad>", "</s>", "<unk>", "<mask>"]), merges=[]
        ),
        seq2seq_reader,
        "encoder_decoder",
        (["<s>"], ["</s>"]),
    ),
    "t5": (
        lambda: transformers.T5Tokenizer(
            vocab=[(p, 0.0) for p in metaspace_pieces(["<pad>", "</s>", "<unk>"])], extra_ids=0
        ),
        seq2seq_reader,
        "encoder_decoder",
        ([], ["</s>"]),
    ),
}


def saved_and_loaded(tokenizer, folder):
    """The tokenizer as a workdir keeps it and load_workdir reads it back."""
    return load_tokenizer(tokenizer.save(folder))


@pytest.mark.parametrize("kind", list(KINDS))
def test_generate_reads_a_text_as_the_models_own_tokenizer(kind, tmp_path):
    """The ids the family's generation takes for TEXT (an LM's prompt: its BOS if any, then the text; a source: the
    text with what the tokenizer adds around it) are transformers' tokenizer(TEXT).input_ids of the saved folder."""
    build, read, family, (before, after) = KINDS[kind]
    build().save_pretrained(tmp_path / "hf")
    ref = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    want = ref(TEXT).input_ids
    words = ref.convert_ids_to_tokens(want)
    assert (words[: len(before)], words[len(words) - len(after) :]) == (before, after)  # the real model's rule
    loaded = saved_and_loaded(read(tmp_path / "hf", ref), tmp_path / "saved")
    ids, _ = FAMILIES[family].read_text(loaded, TEXT)
    assert ids == want
    assert loaded.decode(ids) == TEXT


def test_cut_sources_keep_the_specials_as_transformers_truncation_does(tmp_path):
    """An encoder-decoder's training and evaluation sources from BART's tokenizer: <s> text </s>, cut to
    max_src_len with both specials kept, as tokenizer(text, truncation=True, max_length=n); targets: text, EOS."""
    build, read, _, _ = KINDS["bart"]
    build().save_pretrained(tmp_path / "hf")
    ref = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    tokenizer = saved_and_loaded(read(tmp_path / "hf", ref), tmp_path / "saved")
    pairs = [("a cat", "the mat"), (TEXT, TEXT)]
    (tmp_path / "pairs.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in pairs))
    data = ParallelDataset(tmp_path / "pairs.tsv", tokenizer, max_src_len=12, max_tgt_len=12)
    assert [s.tolist() for s in data.sources] == [ref(s, truncation=True, max_length=12).input_ids for s, _ in pairs]
    text_ids = [ref(t, add_special_tokens=False).input_ids for _, t in pairs]
    assert [t.tolist() for t in data.targets] == [[*ids[:11], ref.eos_token_id] for ids in text_ids]
    assert data.num_truncated == 1


def test_txjax_own_tokenizers_read_a_source_as_their_training_pairs_write_it(tmp_path):
    """A character tokenizer's source for generation is the text then EOS, the ParallelDataset's source of the
    same text (uncut), and the same cut as before the record: tokens[:max_len - 1] + EOS."""
    tokenizer = CharTokenizer.from_text(TEXT, specials=True)
    (tmp_path / "pairs.tsv").write_text(f"{TEXT}\t{TEXT[:5]}\n{TEXT[:7]}\t{TEXT}\n")
    data = ParallelDataset(tmp_path / "pairs.tsv", tokenizer, max_src_len=10, max_tgt_len=40)
    chars = {c: i for i, c in enumerate(sorted(set(TEXT)))}
    eos = len(chars) + 2  # CharTokenizer: pad, bos, eos after the characters
    want = [[chars[c] for c in text][:9] + [eos] for text in (TEXT, TEXT[:7])]
    assert [s.tolist() for s in data.sources] == want
    for family in ("encoder_decoder", "prefix_lm"):
        assert FAMILIES[family].read_text(tokenizer, TEXT[:7]) == (data.sources[1].tolist(), "")
    assert FAMILIES["decoder_lm"].read_text(tokenizer, TEXT[:7])[0] == want[1][:-1]  # an LM's prompt: no EOS


def test_a_workdir_saved_before_the_record_reads_as_it_did(tmp_path):
    """A kind 'hf' tokenizer.json with add_bos and no before/after (written before the record): an LM's prompt
    starts with BOS where add_bos said so, and a source (an encoder-decoder's: add_bos false) is the text then EOS,
    what generation gave then."""
    build, read, _, _ = KINDS["llama"]
    build().save_pretrained(tmp_path / "hf")
    saved = read(tmp_path / "hf", None).save(tmp_path / "saved")
    config = json.loads((saved / "tokenizer.json").read_text())
    text_ids = saved_and_loaded(read(tmp_path / "hf", None), tmp_path / "now").encode(TEXT)
    for add_bos in (True, False):
        old = {k: v for k, v in config.items() if k not in ("before", "after")} | {"add_bos": add_bos}
        (saved / "tokenizer.json").write_text(json.dumps(old))
        loaded = load_tokenizer(saved)
        assert FAMILIES["decoder_lm"].read_text(loaded, TEXT)[0] == [loaded.bos_id] * add_bos + text_ids
        if not add_bos:
            assert FAMILIES["encoder_decoder"].read_text(loaded, TEXT)[0] == [*text_ids, loaded.eos_id]


@pytest.mark.parametrize(
    "arch, flags",
    [
        ("llama", {}),
        ("llama", {"bos": True}),
        ("llama", {"bos": True, "eos": True}),
        ("gemma2", {}),
        ("gemma2", {"bos": False}),
    ],
    ids=["bpe", "bpe-bos", "bpe-bos-eos", "spm", "spm-no-bos"],
)
def test_a_gguf_files_flags_are_what_goes_around_a_text(arch, flags, tmp_path):
    """A .gguf file's tokenizer.ggml.add_bos_token / add_eos_token (a SentencePiece vocabulary without the flag:
    BOS, as llama.cpp adds it): the ids around a text are transformers' tokenizer(text).input_ids of the same file
    (AutoTokenizer, gguf_file=), and an LM's prompt is they but for an EOS after it (it continues the text)."""
    gguf = pytest.importorskip("gguf")
    from tiny_gguf import add_vocabulary, byte_level_bpe, finish, sentencepiece_bpe

    writer = gguf.GGUFWriter(str(tmp_path / "m.gguf"), arch)
    add_vocabulary(writer, sentencepiece_bpe() if arch == "gemma2" else byte_level_bpe(), arch)
    for name, value in flags.items():
        getattr(writer, f"add_add_{name}_token")(value)
    finish(writer)
    ref = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file="m.gguf")
    want = ref(TEXT).input_ids
    tokenizer = gguf_convert.tokenizer_from_gguf(gguf_convert.GGUFFile(tmp_path / "m.gguf"))
    loaded = saved_and_loaded(tokenizer, tmp_path / "saved")
    assert loaded.encode_with_specials(TEXT) == want
    assert want[:1] == [loaded.bos_id] if flags.get("bos", arch == "gemma2") else want[:1] != [loaded.bos_id]
    prompt, _ = FAMILIES["decoder_lm"].read_text(loaded, TEXT)
    assert prompt == (want[:-1] if flags.get("eos") else want)
    np.testing.assert_array_equal(loaded.encode(TEXT), ref(TEXT, add_special_tokens=False).input_ids)
