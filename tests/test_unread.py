"""Fields the config's settings leave unread are refused by name (txjax.unread), a kind's own fields are accepted,
and configs saved into workdirs before the rule load, resume and evaluate as they were."""

import pytest

import run
from txjax import config as config_lib
from txjax.fields import ReadBy
from txjax.sections import schema
from txjax.training import resume

PAIRS = ["--config.family=encoder_decoder", "--config.data.kind=parallel", "--config.data.path=pairs.tsv"]
SHARDS = ["--config.data.kind=shards", "--config.data.path=shards"]
SHARDS_OF_PAIRS = ["--config.family=encoder_decoder", *SHARDS]


KINDS = {  # kind: (its flags, every field it reads set, an unread flag, the line that refuses it)
    "synthetic": (
        [],
        {"task": "sort", "min_digits": 2, "max_digits": 5, "eval_size": 16},
        "--config.data.seq_len=100000",
        "config.data.seq_len=100000 is not read by data.kind='synthetic' (it reads data.task, min_digits, max_digits,"
        " eval_size): set --config.data.seq_len=64 (its default)",
    ),
    "text": (
        ["--config.data.kind=text", "--config.data.path=corpus.txt"],
        {"tokenizer": "sentencepiece", "vocab_size": 100, "seq_len": 128, "val_fraction": 0.2},
        "--config.data.max_digits=4",
        "config.data.max_digits=4 is not read by data.kind='text' (it reads data.path, tokenizer, vocab_size, seq_len,"
        " val_fraction): set --config.data.max_digits=8 (its default)",
    ),
    "parallel": (
        PAIRS,
        {"valid_path": "v.tsv", "test_path": "t.tsv", "max_src_len": 32, "max_tgt_len": 48, "pack": True},
        "--config.data.val_fraction=0.2",
        "config.data.val_fraction=0.2 is not read by data.kind='parallel' (it reads data.path, valid_path, test_path,"
        " tokenizer, vocab_size, max_src_len, max_tgt_len, pack): set --config.data.val_fraction=0.1 (its default)",
    ),
    "chat": (
        ["--config.data.kind=chat", "--config.data.path=c.jsonl"],
        {"tokenizer": "hf", "seq_len": 32, "val_fraction": 0.2, "pack": True},
        "--config.data.max_tgt_len=32",
        "config.data.max_tgt_len=32 is not read by data.kind='chat' (it reads data.path, tokenizer, seq_len,"
        " val_fraction, pack): set --config.data.max_tgt_len=128 (its default)",
    ),
    "shards": (
        SHARDS,
        {"seq_len": 32, "pack": True, "tokenizer": "char"},  # data.tokenizer: recorded (txjax.sections.data)
        "--config.data.max_src_len=32",
        "config.data.max_src_len=32 is not read by data.kind='shards' with family='decoder_lm' (it reads data.path,"
        " tokenizer, seq_len, pack): set --config.data.max_src_len=128 (its default)",
    ),
    "shards of pairs": (
        SHARDS_OF_PAIRS,
        {"max_src_len": 32, "max_tgt_len": 48, "pack": True},
        "--config.data.seq_len=32",
        "config.data.seq_len=32 is not read by data.kind='shards' with family='encoder_decoder' (it reads data.path,"
        " tokenizer, max_src_len, max_tgt_len, pack): set --config.data.seq_len=64 (its default)",
    ),
}


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_accepts_its_fields_and_refuses_an_unread_one_by_name(kind):
    own, reads, unread, line = KINDS[kind]
    read_flags = [f"--config.data.{name}={value}" for name, value in reads.items()]
    config = config_lib.from_command_line(None, [*own, *read_flags])
    assert {name: config.data[name] for name in reads} == reads
    with pytest.raises(config_lib.ConfigError) as e:
        config_lib.from_command_line(None, [*own, *read_flags, unread])
    assert str(e.value) == line


def test_an_unread_field_at_its_default_passes():
    config_lib.from_command_line(None, ["--config.data.seq_len=64", "--config.data.kind=text", "--config.data.path=x"])


def test_run_py_train_prints_the_refusal_as_one_line(capsys, tmp_path):
    assert run.main(["train", f"--workdir={tmp_path / 'run'}", "--config.data.seq_len=100000"]) == 2
    assert capsys.readouterr().err.splitlines() == [f"error: {KINDS['synthetic'][3]}"]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("settings", "line"),
    [
        (
            [
                "--config.data.kind=text",
                "--config.data.path=x",
                "--config.data.tokenizer=char",
                "--config.data.vocab_size=100",
            ],
            "config.data.vocab_size=100 is not read by data.tokenizer='char' (only sentencepiece is trained to a"
            " vocabulary size): set --config.data.vocab_size=8000 (its default), or use data.tokenizer sentencepiece",
        ),
        (
            ["--config.train.decay_fraction=0.5"],
            "config.train.decay_fraction=0.5 is not read by train.schedule='cosine' (only wsd decays over a fraction of"
            " the steps): set --config.train.decay_fraction=0.2 (its default), or use train.schedule wsd",
        ),
        (
            ["--config.train.schedule=constant", "--config.train.min_lr_ratio=0.0"],
            "config.train.min_lr_ratio=0.0 is not read by train.schedule='constant' (it stays at"
            " train.learning_rate): set --config.train.min_lr_ratio=0.1 (its default), or use train.schedule cosine,"
            " linear or wsd",
        ),
        (
            ["--config.train.optimizer=schedule_free_adamw", "--config.train.schedule=wsd"],
            "config.train.schedule='wsd' is not read by train.optimizer='schedule_free_adamw' (it keeps the learning"
            " rate constant after the warmup): set --config.train.schedule=cosine (its default), or use"
            " train.optimizer adamw, lion, adafactor or muon",
        ),
    ],
)
def test_a_field_another_setting_leaves_unread_is_refused(settings, line):
    with pytest.raises(config_lib.ConfigError) as e:
        config_lib.from_command_line(None, settings)
    assert str(e.value) == line


def test_the_settings_that_read_them_accept_them():
    wsd = config_lib.from_command_line(None, ["--config.train.schedule=wsd", "--config.train.decay_fraction=0.5"])
    assert wsd.train.decay_fraction == 0.5
    linear = config_lib.from_command_line(None, ["--config.train.schedule=linear", "--config.train.min_lr_ratio=0"])
    assert linear.train.min_lr_ratio == 0.0


def saved_before_the_rule(workdir) -> None:
    """A workdir whose config.json holds unread fields set to other values than the defaults (as runs saved before
    the rule may)."""
    config = config_lib.from_command_line(None, [])
    config.data.update(seq_len=100000, path="unused.txt")
    config.train.decay_fraction = 0.5
    workdir.mkdir()
    config_lib.save(config, workdir)


def test_a_config_saved_before_the_rule_loads_resumes_and_takes_flags(tmp_path):
    workdir = tmp_path / "run"
    saved_before_the_rule(workdir)
    config = config_lib.from_command_line(None, ["--config.train.steps=50"], workdir)  # resumed from config.json
    assert config.data.seq_len == 100000 and config.train.steps == 50
    with pytest.raises(config_lib.ConfigError, match=r"^config.data.val_fraction=0.3 is not read by data.kind="):
        config_lib.from_command_line(None, ["--config.data.val_fraction=0.3"], workdir)  # a flag: the user's
    # resumed with the experiment file instead: the unread fields go back to their defaults, a change, not refused
    changes = resume.resumed_changes(config_lib.from_command_line(None, []).to_json(), workdir)
    assert changes == {
        "data.path": ["unused.txt", ""],
        "data.seq_len": [100000, 64],
        "train.decay_fraction": [0.5, 0.2],
    }
    with pytest.raises(config_lib.ConfigError, match=r"another run \(data.max_digits 8 -> 5\)"):  # a read one is
        resume.resumed_changes(config_lib.from_command_line(None, ["--config.data.max_digits=5"]).to_json(), workdir)


def test_run_py_eval_validates_a_config_saved_before_the_rule(tmp_path, monkeypatch):
    """eval validates the saved config against itself: its unread fields pass (the load stops at the checkpoints)."""
    import txjax.cli.eval

    workdir = tmp_path / "run"
    saved_before_the_rule(workdir)

    def load_workdir(*args, **kwargs):
        raise RuntimeError("validated")

    monkeypatch.setattr(txjax.cli.eval, "load_workdir", load_workdir)
    with pytest.raises(RuntimeError, match="validated"):
        txjax.cli.eval.main([f"--workdir={workdir}"])


def test_a_new_data_kind_is_its_entry_in_kinds_and_its_form_in_the_fields_it_reads(monkeypatch):
    """A kind added by its entry in txjax.data.KINDS, the form a family reads it in and that form in the read_by of
    the fields it reads is validated, built and its unread fields refused by name, as the shipped kinds are."""
    from txjax import experiment, families
    from txjax.data import kinds

    built = []

    def build(d, split, form, tokenizer, path):
        built.append((d.seq_len, split, form))
        return "the dataset"

    monkeypatch.setitem(kinds.KINDS, "copies", kinds.DataKind({"copy": build}, files=None))
    monkeypatch.setitem(families.get("decoder_lm").data_kinds, "copies", "copy")
    readers = schema.readers()  # the form's name in the read_by of the field it reads (txjax.sections.data)
    seq_len = ReadBy("data.form", (*readers["data.seq_len"][0].values, "copy"), "")
    monkeypatch.setattr(schema, "readers", lambda: readers | {"data.seq_len": (seq_len,)})
    config = config_lib.from_command_line(None, ["--config.data.kind=copies", "--config.data.seq_len=64"])
    assert experiment.build_dataset(config, None, "valid") == "the dataset"
    assert built == [(64, "valid", "copy")]
    line = (
        r"^config.data.task='sort' is not read by data.kind='copies' \(it reads data.seq_len\): set "
        r"--config.data.task=reverse \(its default\)$"
    )
    with pytest.raises(config_lib.ConfigError, match=line):
        config_lib.from_command_line(None, ["--config.data.kind=copies", "--config.data.task=sort"])
