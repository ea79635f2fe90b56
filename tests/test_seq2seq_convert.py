"""Encoder-decoder checkpoints: a tiny random MarianMTModel and BartForConditionalGeneration built by transformers,
imported with `run.py import`, give transformers' logits and greedy translations; a config txjax cannot represent is
refused in one line; fine-tuning the Marian one with train.init_from lowers the loss (skipped without the `interop`
extra)."""

import json

import numpy as np
import pytest

pytestmark = pytest.mark.usefixtures("compilation_cache")  # tests/conftest.py

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

import run  # noqa: E402
from txjax.decode import generate  # noqa: E402
from txjax.experiment import load_workdir  # noqa: E402
from txjax.model.positional import relative_bucket, sinusoidal_halves  # noqa: E402

PAIRS = [
    ("the cat sat on the mat", "el gato se sento en la alfombra"),
    ("the dog ran in the park", "el perro corrio en el parque"),
    ("a bird sings in the tree", "un pajaro canta en el arbol"),
    ("the sun is hot today", "el sol esta caliente hoy"),
    ("we read a book at night", "leemos un libro por la noche"),
    ("my friend lives near the sea", "mi amigo vive cerca del mar"),
] * 4
VOCAB, CTX = 120, 64
BART_SIZES = dict(
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=2,
    decoder_attention_heads=2,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_position_embeddings=CTX,
    scale_embedding=True,
)
# T5: d_kv apart from d_model / heads, 8 buckets up to distance 20, so that 40 tokens reach the logarithmic ones
T5_SIZES = dict(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=2, relative_attention_num_buckets=8)
T5_SIZES |= dict(relative_attention_max_distance=20, n_positions=CTX)
# per model: its specials in id order, (EOS, pad, decoder start), the config class and its fields
MODELS = {
    "marian": (["</s>", "<unk>", "<pad>"], (0, 2, 2), "MarianConfig", BART_SIZES | dict(activation_function="swish")),
    "bart": (["<s>", "<pad>", "</s>", "<unk>"], (2, 1, 2), "BartConfig", BART_SIZES | dict(activation_function="gelu")),
    "t5": (["<pad>", "</s>", "<unk>"], (1, 0, 0), "T5Config", T5_SIZES | dict(feed_forward_proj="relu")),
    "t5v1_1": (["<pad>", "</s>", "<unk>"], (1, 0, 0), "T5Config", T5_SIZES | dict(feed_forward_proj="gated-gelu")),
}


def hf_config(kind, **changes):
    _, (eos, pad, start), config_class, fields = MODELS[kind]
    fields = fields | dict(
        vocab_size=VOCAB,
        eos_token_id=eos,
        pad_token_id=pad,
        decoder_start_token_id=start,  # Marian's and T5's decoders start from pad, BART's from EOS
        forced_eos_token_id=None,  # generate would force EOS as the 40th token; txjax's greedy search does not
    )
    if kind == "t5v1_1":
        fields["tie_word_embeddings"] = False  # v1.1: no d_model^-0.5 on the decoder output (transformers 5 ties)
    return getattr(transformers, config_class)(**(fields | changes))


def save_tiny(kind, folder, **changes):
    """A random 2+2-layer model of `kind` with a random final_logits_bias (T5: relative bias and tokens of std 1) and
    EOS pushed down (T5: its token row zero) so that greedy search runs its 40 tokens, saved by transformers with a
    BPE fast tokenizer trained on both sides of PAIRS; returns it."""
    specials = MODELS[kind][0]
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=specials)
    bpe.train_from_iterator([s for pair in PAIRS for s in pair], trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, unk_token="<unk>")
    torch.manual_seed(0)
    config = hf_config(kind, **changes)
    model = transformers.AutoModelForSeq2SeqLM.from_config(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" not in name or kind != "marian":  # Marian's sinusoid table is a parameter too
                p.normal_(1.0 if "norm" in name and name.endswith("weight") else 0.0, 0.2)
        if hasattr(model, "final_logits_bias"):
            model.final_logits_bias.normal_(0.0, 1.0)
            model.final_logits_bias[0, config.eos_token_id] = -30.0
        else:
            for name, p in model.named_parameters():
                if "relative_attention_bias" in name:
                    p.normal_(0.0, 1.0)
            model.get_input_embeddings().weight.normal_(0.0, 1.0)  # T5's init: the head reads it at d_model^-0.5
            model.get_input_embeddings().weight[config.eos_token_id] = 0.0
    model.save_pretrained(folder)
    fast.save_pretrained(folder)
    return model


@pytest.fixture(scope="module", params=list(MODELS))
def imported(request, tmp_path_factory):
    """(transformers' model, the workdir `run.py import` wrote from its folder)."""
    root = tmp_path_factory.mktemp(request.param)
    hf = save_tiny(request.param, root / "hf")
    assert run.main(["import", f"--from={root / 'hf'}", f"--workdir={root / 'wd'}"]) == 0
    return hf, root / "wd"


def sources(tokenizer):
    """Two sources of different lengths, each ending with EOS as MarianTokenizer's do, right-padded."""
    eos = tokenizer.eos_id
    ids = [tokenizer.encode(PAIRS[0][0]) + [eos], tokenizer.encode(PAIRS[3][0] + " " + PAIRS[4][0]) + [eos]]
    src = np.full((2, max(map(len, ids))), tokenizer.pad_id, np.int32)
    mask = np.zeros_like(src)
    for row, row_mask, s in zip(src, mask, ids):
        row[: len(s)], row_mask[: len(s)] = s, 1
    return ids, src, mask


def test_positions_are_marians_table():
    """sinusoidal_halves against transformers' MarianSinusoidalPositionalEmbedding (sines first, then cosines)."""
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    for d in (32, 7):
        table = MarianSinusoidalPositionalEmbedding(CTX, d)
        want = table.create_weight().numpy()
        got = np.asarray(sinusoidal_halves(np.arange(CTX)[None], d))[0]
        np.testing.assert_allclose(got, want, atol=2e-5)


def test_relative_buckets_are_t5s():
    """relative_bucket against transformers' T5Attention._relative_position_bucket, both directions and the causal
    form, distances past max_distance included."""
    from transformers.models.t5.modeling_t5 import T5Attention

    relative = np.arange(-300, 301)[None, :]
    for bidirectional in (True, False):
        for buckets, distance in ((32, 128), (8, 20)):
            want = T5Attention._relative_position_bucket(torch.tensor(relative), bidirectional, buckets, distance)
            got = relative_bucket(relative, bidirectional, buckets, distance)
            np.testing.assert_array_equal(np.asarray(got), want.numpy())


def test_logits_equal_transformers(imported):
    """Logits of a source batch (one row padded) and a target prefix from the decoder start, within 1e-4."""
    hf, workdir = imported
    run_ = load_workdir(workdir)
    tok, config = run_.tokenizer, hf.config
    want_ids = (config.decoder_start_token_id, config.eos_token_id, config.pad_token_id)
    assert (run_.config.family, tok.bos_id, tok.eos_id, tok.pad_id) == ("encoder_decoder", *want_ids)
    _, src, mask = sources(tok)
    tgt = np.array([[tok.bos_id, *tok.encode(PAIRS[0][1])[:6]]] * 2, np.int32)
    with torch.no_grad():
        want = hf(
            input_ids=torch.tensor(src, dtype=torch.long),
            attention_mask=torch.tensor(mask),
            decoder_input_ids=torch.tensor(tgt, dtype=torch.long),
        ).logits.numpy()
    got = run_.model.apply({"params": run_.params}, src, tgt, src_segment_ids=mask)
    assert np.abs(want).max() > 1.0  # the final_logits_bias and weights make the logits far from zero
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("imported", ["marian", "bart", "t5v1_1"], indirect=True)
def test_greedy_translation_equals_transformers(imported):
    """generate from sources, starting from the imported BOS (the decoder start): transformers' 40 tokens. (T5
    v1.0 decodes as v1.1 does; its ReLU and scaled tied head are in the logits test.)"""
    hf, workdir = imported
    run_ = load_workdir(workdir)
    tok = run_.tokenizer
    ids, src, mask = sources(tok)
    with torch.no_grad():
        out = hf.generate(
            input_ids=torch.tensor(src, dtype=torch.long),
            attention_mask=torch.tensor(mask),
            do_sample=False,
            num_beams=1,
            max_new_tokens=40,
        ).numpy()
    assert (out[:, 0] == tok.bos_id).all()
    strategy = dict(max_new_tokens=40, eos_id=tok.eos_id)
    got = generate(run_.model, run_.params, ids, bos_id=tok.bos_id, pad_id=tok.pad_id, **strategy)
    assert [len(g) for g in got.ids] == [40, 40]
    assert got.ids == out[:, 1:].tolist()


@pytest.mark.parametrize("imported", ["marian"], indirect=True)
def test_export_round_trip(imported, tmp_path):
    """run.py export of the imported Marian workdir: a folder transformers loads, with the same logits."""
    hf, workdir = imported
    assert run.main(["export", f"--workdir={workdir}", f"--to={tmp_path / 'out'}"]) == 0
    back = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "out").eval()
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    assert tok.eos_token_id == hf.config.eos_token_id and back.config.decoder_start_token_id == tok.pad_token_id
    src = torch.tensor([[5, 17, 9, 30, hf.config.eos_token_id]])
    tgt = torch.tensor([[hf.config.decoder_start_token_id, 7, 11, 40]])
    with torch.no_grad():
        want = hf(input_ids=src, decoder_input_ids=tgt).logits
        got = back(input_ids=src, decoder_input_ids=tgt).logits
    np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "kind, changes, field",
    [
        ("marian", dict(decoder_ffn_dim=96), "decoder_ffn_dim"),
        ("marian", dict(activation_function="tanh"), "activation_function"),
        ("marian", dict(decoder_vocab_size=VOCAB - 20), "decoder_vocab_size"),
        ("bart", dict(encoder_attention_heads=4), "decoder_attention_heads"),
        ("t5", dict(feed_forward_proj="gated-relu"), "feed_forward_proj"),
    ],
)
def test_unrepresentable_config_is_one_line(tmp_path, capsys, kind, changes, field):
    """config.json says what txjax cannot compute: one line naming the field, and no workdir."""
    (tmp_path / "hf").mkdir()
    config = hf_config(kind).to_dict() | changes
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    assert run.main(["import", f"--from={tmp_path / 'hf'}", f"--workdir={tmp_path / 'wd'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{field}=" in err
    assert not (tmp_path / "wd").exists()


@pytest.mark.parametrize("imported", ["marian"], indirect=True)
def test_init_from_fine_tunes_on_parallel_data(imported, tmp_path):
    """train.init_from=the imported workdir on a TSV of the pairs: the loss falls; the run keeps Marian's model and
    tokenizer (targets start from its pad)."""
    _, workdir = imported
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("".join(f"{s}\t{t}\n" for s, t in PAIRS))
    flags = [
        f"--config.train.init_from={workdir}",
        "--config.family=encoder_decoder",  # as an experiment file of parallel data says (bible_en_es.py)
        "--config.data.kind=parallel",
        f"--config.data.path={tsv}",
        f"--config.data.valid_path={tsv}",
        "--config.data.max_src_len=24",
        "--config.data.max_tgt_len=24",
        "--config.model.dropout=0",
        "--config.train.steps=10",
        "--config.train.batch_size=8",
        "--config.train.learning_rate=3e-3",
        "--config.train.warmup_steps=1",
        "--config.train.log_every=1",
        "--config.train.eval_batches=0",
    ]
    tuned = tmp_path / "tuned"
    assert run.main(["train", f"--workdir={tuned}", *flags]) == 0
    records = map(json.loads, (tuned / "metrics.jsonl").open())
    losses = [r["loss"] for r in records if r.get("split") == "train"]
    assert len(losses) == 10 and np.mean(losses[-3:]) < np.mean(losses[:3]) - 1.0, losses
    result = load_workdir(tuned)
    assert result.model.cfg.positional == "sinusoidal_halves" and result.tokenizer.bos_id == MODELS["marian"][1][2]
