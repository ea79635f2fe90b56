"""Encoder-decoder checkpoints: tiny random MarianMTModel, BartForConditionalGeneration and T5 (v1.0 and v1.1) models
built by transformers (tests/tiny_hf.py), imported with `run.py import`, give transformers' logits and greedy
translations; `run.py export` writes them back as folders transformers loads with the same logits; a config txjax
cannot represent is refused in one line; train.init_from takes an imported Marian model and tokenizer, and
fine-tuning the T5 one on ../shared/data/bible lowers the loss and `run.py eval --split=test` prints BLEU (skipped
without the `interop` extra, the data skipped without ../shared)."""

import dataclasses
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from tiny_hf import (  # noqa: E402
    PAIRS,
    S2S_CTX,
    S2S_VOCAB,
    SEQ2SEQ,
    marian_tokenizer,
    save_marian_tokenizer,
    save_tiny_seq2seq,
    seq2seq_config,
    seq2seq_logits,
)
from tiny_peft import assert_adapter_reads_back, peft_loaded  # noqa: E402

import run  # noqa: E402
from txjax import config as config_lib  # noqa: E402
from txjax.convert import bart, hf_folder, marian, t5  # noqa: E402
from txjax.decode import generate  # noqa: E402
from txjax.decode.workdir import workdir_prompt  # noqa: E402
from txjax.experiment import build_tokenizer, load_workdir  # noqa: E402
from txjax.families import build, init_params  # noqa: E402
from txjax.model.positional import relative_bucket, sinusoidal_halves  # noqa: E402
from txjax.sections import schema  # noqa: E402
from txjax.training import init_from  # noqa: E402

BIBLE = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "bible"  # ../shared of the repo root


@pytest.fixture(scope="module", params=list(SEQ2SEQ))
def imported(request, tmp_path_factory):
    """(transformers' model, the workdir `run.py import` wrote from its folder); Marian's folder holds
    MarianTokenizer's files and a stand-in tokenizer.json of their vocabulary (tiny_hf.save_marian_tokenizer)."""
    root = tmp_path_factory.mktemp(request.param)
    hf = save_tiny_seq2seq(request.param, root / "hf")
    if request.param == "marian":
        save_marian_tokenizer(root / "hf")
    assert run.main(["import", f"--from={root / 'hf'}", f"--workdir={root / 'wd'}"]) == 0
    return hf, root / "wd"


def reference_tokenizer(workdir):
    """transformers' tokenizer of the imported folder: MarianTokenizer where its files are, else AutoTokenizer."""
    folder = workdir.parent / "hf"
    if (folder / "source.spm").is_file():
        return marian_tokenizer(folder)
    return transformers.AutoTokenizer.from_pretrained(folder)


def test_positions_are_marians_table():
    """sinusoidal_halves against transformers' MarianSinusoidalPositionalEmbedding (sines first, then cosines)."""
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    for d in (32, 7):
        table = MarianSinusoidalPositionalEmbedding(S2S_CTX, d)
        want = table.create_weight().numpy()
        got = np.asarray(sinusoidal_halves(np.arange(S2S_CTX)[None], d))[0]
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
    want, got = seq2seq_logits(hf, run_.model, run_.params, tok)
    assert np.abs(want).max() > 1.0  # the final_logits_bias and weights make the logits far from zero
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("imported", ["marian", "bart", "t5v1_1"], indirect=True)
def test_greedy_translation_of_a_text_equals_transformers(imported):
    """Two texts read as `run.py generate` reads them (workdir_prompt: the tokenizer's specials around each, as
    the model's own tokenizer adds them: Marian's and T5's </s> after, BART's <s> before too) are transformers'
    tokenizer(text).input_ids, and generate from them, as one padded batch from the imported BOS (the decoder
    start), gives the 40 tokens of transformers' model.generate(**tokenizer(text, return_tensors="pt")). (T5 v1.0
    decodes as v1.1 does; its ReLU and scaled tied head are in the logits test.)"""
    hf, workdir = imported
    run_, ref = load_workdir(workdir), reference_tokenizer(workdir)
    tok = run_.tokenizer
    texts = [PAIRS[0][0], PAIRS[3][0] + " " + PAIRS[4][0]]
    prompts = [workdir_prompt(run_, text, method="greedy", max_new_tokens=40) for text in texts]
    ids = [row for row, _, _ in prompts]
    assert ids == [ref(text).input_ids for text in texts] and len(ids[0]) != len(ids[1])
    with torch.no_grad():
        out = [
            hf.generate(**ref(text, return_tensors="pt"), do_sample=False, num_beams=1, max_new_tokens=40)[0]
            for text in texts
        ]
    assert all(row[0] == tok.bos_id for row in out)
    got = generate(run_.model, run_.params, ids, bos_id=tok.bos_id, pad_id=tok.pad_id, **prompts[0][2])
    assert [len(g) for g in got.ids] == [40, 40]
    assert got.ids == [row[1:].tolist() for row in out]


def test_export_round_trip(imported, tmp_path):
    """run.py export of each imported workdir: a folder transformers loads (T5's tied head with its d_model^-0.5
    taken back out of the final norm), with the same logits and special ids, and a tokenizer that writes a text as
    the imported one did (Marian's: its EOS after, by a post-processor its stand-in tokenizer.json lacked)."""
    hf, workdir = imported
    assert run.main(["export", f"--workdir={workdir}", f"--to={tmp_path / 'out'}"]) == 0
    back = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "out").eval()
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    assert (tok.eos_token_id, tok.pad_token_id) == (hf.config.eos_token_id, hf.config.pad_token_id)
    assert tok(PAIRS[0][0]).input_ids == reference_tokenizer(workdir)(PAIRS[0][0]).input_ids
    assert back.config.decoder_start_token_id == hf.config.decoder_start_token_id
    src = torch.tensor([[5, 17, 9, 30, hf.config.eos_token_id]])
    tgt = torch.tensor([[hf.config.decoder_start_token_id, 7, 11, 40]])
    with torch.no_grad():
        want = hf(input_ids=src, decoder_input_ids=tgt).logits
        got = back(input_ids=src, decoder_input_ids=tgt).logits
    assert want.abs().max() > 1.0
    np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-5, rtol=0)


@pytest.mark.parametrize("imported", ["t5v1_1"], indirect=True)
def test_untied_t5_exports_its_own_head(imported, tmp_path):
    """An untied T5 head (mT5's, v1.1's in older files) exports as lm_head.weight with tie_word_embeddings false:
    transformers gives txjax's logits, unscaled."""
    _, workdir = imported
    run_ = load_workdir(workdir)
    cfg = dataclasses.replace(run_.model.cfg, tie_embeddings=False)
    head = np.random.default_rng(0).normal(0, 1, (cfg.d_model, cfg.vocab_size)).astype(np.float32)
    params = dict(run_.params) | {"src_embed": dict(run_.params["src_embed"]) | {"lm_head": {"kernel": head}}}
    t5.write_t5(tmp_path, cfg, params, run_.tokenizer)
    back = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    want, got = seq2seq_logits(back, build("encoder_decoder", cfg), params, run_.tokenizer)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("imported", ["t5"], indirect=True)
def test_export_refuses_what_the_family_lacks_in_one_line(imported):
    """A field T5 or BART fixes, changed (as an experiment may): its exporter names it, before anything is
    written (the folder given is never touched)."""
    _, workdir = imported
    run_ = load_workdir(workdir)
    cases = [
        (t5.write_t5, dataclasses.replace(run_.model.cfg, norm="layernorm"), "model.norm='layernorm'"),
        (t5.write_t5, dataclasses.replace(run_.model.cfg, num_kv_heads=1), "model.num_kv_heads=1"),
        (bart.write_bart, run_.model.cfg, "model.positional='relative_buckets'"),
    ]
    for export, cfg, field in cases:
        with pytest.raises(ValueError, match=re.escape(field)) as e:
            export(None, cfg, run_.params, run_.tokenizer)
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("imported", ["marian"], indirect=True)
def test_an_import_traces_the_model_once(imported, monkeypatch):
    """The memory check, the converter's abstract run on the headers and its own check of the params share one
    abstract init of the model (hf_folder.expected_shapes)."""
    _, workdir = imported
    traced = []
    monkeypatch.setattr(hf_folder, "init_params", lambda *a: traced.append(1) or init_params(*a))
    hf_folder.expected_shapes.cache_clear()
    marian.load_marian(workdir.parent / "hf")
    assert len(traced) == 1


@pytest.mark.parametrize("imported", ["bart"], indirect=True)
def test_bart_export_refuses_token_tables_moved_apart(imported, tmp_path, capsys):
    """BART has one token table: an encoder's that fine-tuning moved from the decoder's is one line, no folder."""
    _, workdir = imported
    run_ = load_workdir(workdir)
    params = dict(run_.params) | {"src_embed": dict(run_.params["src_embed"])}
    params["src_embed"]["tokens"] = {"embedding": run_.params["src_embed"]["tokens"]["embedding"] + 1e-3}
    with pytest.raises(ValueError, match="token tables differ") as e:
        bart.params_to_hf(params, run_.model.cfg)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "kind, changes, field",
    [
        ("marian", dict(decoder_ffn_dim=96), "decoder_ffn_dim"),
        ("marian", dict(activation_function="tanh"), "activation_function"),
        ("marian", dict(decoder_vocab_size=S2S_VOCAB - 20), "decoder_vocab_size"),
        ("bart", dict(encoder_attention_heads=4), "decoder_attention_heads"),
        ("t5", dict(feed_forward_proj="gated-relu"), "feed_forward_proj"),
    ],
)
def test_unrepresentable_config_is_one_line(tmp_path, capsys, kind, changes, field):
    """config.json says what txjax cannot compute: one line naming the field, and no workdir."""
    (tmp_path / "hf").mkdir()
    config = seq2seq_config(kind).to_dict() | changes
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    assert run.main(["import", f"--from={tmp_path / 'hf'}", f"--workdir={tmp_path / 'wd'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{field}=" in err
    assert not (tmp_path / "wd").exists()


def fine_tuning_flags(workdir, train_path) -> list[str]:
    """train.init_from=the imported workdir on English-Spanish pairs (the data section `run.py import` writes for an
    encoder-decoder, given absolute here)."""
    return [
        f"--config.train.init_from={workdir}",
        "--config.family=encoder_decoder",  # as an experiment file of parallel data says (bible_en_es.py)
        "--config.data.kind=parallel",
        f"--config.data.path={train_path}",
        f"--config.data.valid_path={BIBLE / 'valid.en-es.tsv'}",
        f"--config.data.test_path={BIBLE / 'test.en-es.tsv'}",
        "--config.data.max_src_len=24",
        "--config.data.max_tgt_len=24",
        "--config.model.dropout=0",
    ]


@pytest.mark.parametrize("imported", ["marian"], indirect=True)
def test_init_from_takes_the_imported_model_and_tokenizer(imported, tmp_path):
    """train.init_from=an imported Marian workdir: the run's model section becomes the import's (its sinusoidal
    positions) and its tokenizer the import's, whose BOS is Marian's decoder start (pad). (Training from an import
    and evaluating it: the T5 case below.)"""
    hf, workdir = imported
    config = config_lib.load_config()
    for flag in fine_tuning_flags(workdir, tmp_path / "train.tsv"):
        config_lib.apply_override(config, flag)
    init_from.adopt_model(config, tmp_path / "tuned")
    model, want = config.model.to_dict(), config_lib.load(workdir).model.to_dict()
    kept = set(schema.resumable_fields("model"))  # the run's own: dropout, dtype, ...
    assert {k: v for k, v in model.items() if k not in kept} == {k: v for k, v in want.items() if k not in kept}
    assert config.model.positional == "sinusoidal_halves"
    tokenizer = build_tokenizer(config, tmp_path / "tuned")
    assert (tokenizer.bos_id, tokenizer.pad_id) == (hf.config.decoder_start_token_id, hf.config.pad_token_id)


@pytest.mark.parametrize("imported", ["t5"], indirect=True)
def test_fine_tuning_on_the_bible_lowers_the_loss_and_eval_prints_bleu(imported, tmp_path, capsys):
    """train.init_from=the imported T5 workdir on ../shared/data/bible's English-Spanish pairs (the first 512 of its
    training pairs): the loss falls, the run keeps the model's positions and tokenizer (targets start from its
    decoder start), and `run.py eval --split=test` prints the BLEU line and a finite score (of up to 16 new tokens
    per source: compiling the decoding loop is most of its cost)."""
    if not (BIBLE / "train.en-es.tsv").is_file():
        pytest.skip(f"{BIBLE} is absent (the shared data folder beside the repository)")
    hf, workdir = imported
    train_path = tmp_path / "train.en-es.tsv"
    with (BIBLE / "train.en-es.tsv").open() as pairs:
        train_path.write_text("".join(line for _, line in zip(range(512), pairs)))
    flags = [
        *fine_tuning_flags(workdir, train_path),
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
    assert len(losses) == 10 and np.mean(losses[-3:]) < np.mean(losses[:3]) - 0.5, losses
    result = load_workdir(tuned)
    assert result.model.cfg.positional == load_workdir(workdir).model.cfg.positional
    assert result.tokenizer.bos_id == hf.config.decoder_start_token_id
    capsys.readouterr()
    assert run.main(["eval", f"--workdir={tuned}", "--split=test", "--config.decode.max_new_tokens=16"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    metrics = json.loads(lines[-1])
    assert any(line.startswith("BLEU") for line in lines) and math.isfinite(metrics["bleu"]), lines
    assert metrics["split"] == "test" and metrics["bleu_signature"]


@pytest.mark.parametrize("imported", ["marian"], indirect=True)
def test_a_lora_adapter_loads_in_peft_with_txjaxs_logits(imported, tmp_path):
    """txjax's peft export of adapters on every projection (self- and cross-attention, the FFN) loaded by peft onto
    the transformers model: txjax's merged model's logits, within 1e-4; the folder read back onto the base is the same
    adapters."""
    pytest.importorskip("peft")
    hf, workdir = imported
    run_ = load_workdir(workdir)
    adapted, merged = peft_loaded(hf, run_.model, run_.params, marian.params_to_hf, tmp_path / "adapter")
    want, got = seq2seq_logits(adapted, run_.model, merged, run_.tokenizer)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    assert np.abs(got - seq2seq_logits(hf, run_.model, run_.params, run_.tokenizer)[1]).max() > 1e-2
    assert_adapter_reads_back(tmp_path / "adapter", run_.model, run_.params, marian.params_to_hf, merged)
