"""The config's schema (txjax.sections): every setting is read or refused for every optimizer, schedule and data kind
(a field set to another value either changes what the run computes or is refused in one line naming it and the flag
that sets it back), base_config, the ranges and the resume policy come from the fields, the issue's ignored
settings are refused, and train.init_from applies the model flags that keep the parameters' shapes."""

import dataclasses
import functools
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

import run
from txjax import config as config_lib
from txjax import families
from txjax.data.kinds import KINDS
from txjax.fields import at_least, setting
from txjax.model import roles
from txjax.sections import schema
from txjax.sections.mesh import MeshShape
from txjax.state import optim

PARAMS = {"embed": jnp.ones((8, 4)) * 0.3, "w": jnp.eye(4) * 0.5 + 0.1, "norm": jnp.ones((4,))}
ROLES = {"embed": roles.EMBEDDING, "w": roles.MATRIX, "norm": roles.NORM}


def probe(field: dataclasses.Field, value):
    """Another value of the field, in its range: its next choice, twice a number (half where twice leaves the
    range), true for false; a changed string."""
    if field.metadata.get("choices"):
        return next(c for c in field.metadata["choices"] if c != value)
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        bounds = field.metadata.get("bounds")
        twice = type(value)(value * 2) if value else type(value)(1)
        return twice if bounds is None or bounds.ok(twice) else value / 2
    return value + "x" if value else "x"


def trained(train: dict) -> dict:
    """PARAMS after train.steps updates of the optimizer of config.train `train` (the loop runs that many), on
    gradients whose global norms alternate 3 and 0.3 (so that a clip between them changes the update, Adam's
    normalisation notwithstanding)."""
    tx = optim.make_optimizer(optim.OptimConfig.of(train), ROLES)
    params, state = PARAMS, tx.init(PARAMS)
    for step, key in enumerate(jax.random.split(jax.random.key(0), train.steps)):
        leaves = [jax.random.normal(k, p.shape) for k, p in zip(jax.random.split(key, 3), PARAMS.values())]
        scale = (0.3 if step % 2 else 3.0) / jnp.sqrt(sum(jnp.sum(g**2) for g in leaves))
        grads = {name: g * scale for name, g in zip(PARAMS, leaves)}
        updates, state = tx.update(grads, state, params)
        params = jax.tree.map(lambda p, u: p + u, params, updates)
    return params


def read_or_refused(config, defaults, name: str, run_of) -> str:
    """'refused' (one line naming config.`name` and a flag setting it back) or 'read' (what `run_of` computes
    differs from the defaults'); fails otherwise: accepted and ignored."""
    try:
        config_lib.validate(config, defaults)
    except config_lib.ConfigError as e:
        line = str(e)
        assert "\n" not in line and f"config.{name}=" in line, line
        return "refused"
    assert run_of(config) != run_of(defaults), f"config.{name} is accepted and changes nothing"
    return "read"


def optimizer_baseline(optimizer: str, schedule: str):
    config = config_lib.base_config()
    # a short run whose every schedule setting shows within its steps: the warmup ends at step 1, wsd's decay starts
    # halfway through the rest
    config.train.update(optimizer=optimizer, schedule=schedule, steps=6, warmup_steps=1, decay_fraction=0.5)
    return config


def fingerprint(config) -> list:
    return _fingerprint(config.train.to_json())


@functools.cache  # each field's probe is compared with the same defaults: those train once
def _fingerprint(train_json: str) -> list:
    train = ml_collections.ConfigDict(json.loads(train_json))
    return [np.asarray(leaf).tobytes() for leaf in jax.tree.leaves(trained(train))]


OPTIM_FIELDS = [f for f in dataclasses.fields(optim.OptimConfig) if f.name != "optimizer"]


@pytest.mark.parametrize("optimizer", optim.OPTIMIZERS)
def test_every_optimizer_reads_or_refuses_each_of_its_settings(optimizer):
    outcomes = {}
    for field in OPTIM_FIELDS:
        defaults = optimizer_baseline(optimizer, "wsd")  # wsd reads decay_fraction and min_lr_ratio
        config = optimizer_baseline(optimizer, "wsd")
        config.train[field.name] = probe(field, config.train[field.name])
        outcomes[field.name] = read_or_refused(config, defaults, f"train.{field.name}", fingerprint)
    refused = {name for name, outcome in outcomes.items() if outcome == "refused"}
    expected = {"decay_start"}  # "budget" needs a time budget
    expected |= {"b1", "b2"} if optimizer == "adafactor" else set()
    expected |= {"schedule", "decay_fraction", "min_lr_ratio"} if optimizer == "schedule_free_adamw" else set()
    assert refused == expected


@pytest.mark.parametrize("schedule", optim.SCHEDULES)
def test_every_schedule_reads_or_refuses_each_optimizer_setting(schedule):
    refused = set()
    for field in OPTIM_FIELDS:
        defaults, config = optimizer_baseline("adamw", schedule), optimizer_baseline("adamw", schedule)
        config.train[field.name] = probe(field, config.train[field.name])
        if read_or_refused(config, defaults, f"train.{field.name}", fingerprint) == "refused":
            refused.add(field.name)
    expected = {"decay_start"} | ({"decay_fraction"} if schedule != "wsd" else set())
    assert refused == expected | ({"min_lr_ratio"} if schedule == "constant" else set())


class Spy:
    """A data section that records which fields are read."""

    def __init__(self, section):
        self.section, self.read = section, set()

    def __getattr__(self, name):
        self.read.add(name)
        return self.section[name]


FORMS = [(family, kind) for family, f in families.FAMILIES.items() for kind in f.data_kinds]
FILES = {
    "text": ("corpus.txt", "char"),
    "parallel": ("pairs.tsv", "char"),
    "chat": ("chats.jsonl", "hf"),
    "shards": ("shards", "task"),
}
# read where the run's files and tokenizer are found (txjax.experiment: data_file, build_tokenizer), not by a builder
EDGE = {"path", "valid_path", "test_path", "tokenizer", "vocab_size"}


def data_baseline(family: str, kind: str):
    config = config_lib.base_config()
    config.family, config.data.kind = family, kind
    if kind in FILES:
        config.data.path, config.data.tokenizer = FILES[kind]
    return config


def builder_reads(config) -> set:
    """The data fields the kind's builder of the config's form reads (its files absent: it fails after reading)."""
    form = families.get(config.family).data_kinds[config.data.kind]
    spy = Spy(config.data)
    try:
        KINDS[config.data.kind].forms[form](spy, "train", form, None, lambda: Path("/nonexistent/data"))
    except Exception:  # noqa: BLE001 (the missing file or tokenizer: what it read is recorded)
        pass
    return spy.read


@pytest.mark.parametrize(("family", "kind"), FORMS)
def test_every_data_kind_reads_or_refuses_each_data_setting(family, kind):
    read = set()
    for field in dataclasses.fields(schema.SECTIONS["data"][0]):
        if field.name == "kind":
            continue
        defaults, config = data_baseline(family, kind), data_baseline(family, kind)
        config.data[field.name] = probe(field, config.data[field.name])
        try:
            config_lib.validate(config, defaults)
        except config_lib.ConfigError as e:
            assert "\n" not in str(e) and f"config.data.{field.name}=" in str(e), str(e)
            continue
        read.add(field.name)
    builder = builder_reads(data_baseline(family, kind))
    assert builder <= read  # a field the builder reads is never refused
    assert read <= builder | EDGE  # an accepted field is read: by the builder, or where files and tokenizer are


@pytest.mark.parametrize(
    ("experiment", "flags", "named"),
    [
        (None, ["train.optimizer=adafactor", "train.b1=0.5", "train.b2=0.5"], ["train.b1", "train.b2"]),
        (None, ["model.rope_scaling=linear", "model.rope_factor=2"], ["model.rope_scaling", "model.rope_factor"]),
        (None, ["model.positional=alibi", "model.rope_factor=2"], ["model.rope_factor"]),
        (None, ["model.positional=rope", "model.rope_factor=2"], ["model.rope_factor"]),
        (None, ["model.prefix_attention=causal"], ["model.prefix_attention"]),
        ("experiments/add_seq2seq.py", ["model.prefix_attention=causal"], ["model.prefix_attention"]),
        (
            "experiments/add_seq2seq.py",
            ["family=prefix_lm", "model.num_encoder_layers=2"],
            ["model.num_encoder_layers"],
        ),
        (None, ["model.num_layers=2", "model.attention_window=4", "model.window_pattern=LLLG"], []),
        (None, ["decode.temperature=0.5", "decode.beam_size=2"], ["decode.temperature", "decode.beam_size"]),
    ],
)
def test_the_settings_the_issue_found_ignored_are_refused_naming_every_one(experiment, flags, named):
    with pytest.raises(config_lib.ConfigError) as e:
        config_lib.from_command_line(experiment, [f"--config.{flag}" for flag in flags])
    line = str(e.value)
    assert "\n" not in line and "remove it" not in line
    for name in named:
        assert f"config.{name}=" in line and f"--config.{name}=" in line  # what it is, and what to set instead


def test_the_flags_a_refusal_names_make_the_config_valid():
    flags = ["--config.train.optimizer=adafactor", "--config.train.b1=0.5", "--config.train.b2=0.5"]
    flags += ["--config.data.seq_len=100"]  # unread by the synthetic task: a second group, in the same line
    with pytest.raises(config_lib.ConfigError) as e:
        config_lib.from_command_line(None, flags)
    suggested = [word for word in str(e.value).replace(")", " ").split() if word.startswith("--config.")]
    assert sorted(suggested) == ["--config.data.seq_len=64", "--config.train.b1=0.9", "--config.train.b2=0.99"]
    config = config_lib.from_command_line(None, flags + suggested)
    assert config.train.optimizer == "adafactor"


def test_every_bad_choice_and_every_number_out_of_range_is_named_in_one_line():
    for flags, named in [
        (["train.optimizer=adam", "train.schedule=cosin"], ["train.optimizer='adam'", "train.schedule='cosin'"]),
        (["train.b1=1.5", "train.steps=0", "mesh.data=0"], ["train.b1=1.5", "train.steps=0", "mesh.data=0"]),
    ]:
        with pytest.raises(config_lib.ConfigError) as e:
            config_lib.from_command_line(None, [f"--config.{flag}" for flag in flags])
        assert "\n" not in str(e.value) and all(f"config.{name} " in str(e.value) for name in named), str(e.value)


def test_run_py_train_refuses_an_adafactor_b1_in_one_line_before_writing(capsys, tmp_path):
    flags = ["--config.train.optimizer=adafactor", "--config.train.b1=0.5"]
    assert run.main(["train", f"--workdir={tmp_path / 'run'}", *flags]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: config.train.b1=0.5 is not read by train.optimizer='adafactor'")
    assert "set --config.train.b1=0.9 (its default)" in line
    assert not (tmp_path / "run").exists()


@dataclasses.dataclass(frozen=True)
class WiderMesh(MeshShape):
    pipeline: int = setting(2, bounds=at_least(1), resume=False)


def test_a_new_field_is_in_base_config_the_ranges_and_the_resume_policy(monkeypatch):
    monkeypatch.setitem(schema.SECTIONS, "mesh", (WiderMesh,))
    assert config_lib.base_config().mesh.pipeline == 2
    assert schema.resume_refused("mesh.pipeline") and not schema.resume_refused("mesh.data")
    monkeypatch.setattr(config_lib.ranges, "RANGES", schema.ranges())
    with pytest.raises(config_lib.ConfigError, match=r"^config.mesh.pipeline=0 must be >= 1$"):
        config_lib.from_command_line(None, ["--config.mesh.pipeline=0"])


def test_the_resume_policy_is_the_one_the_runs_had():
    """The fields a resume refuses, as config.py listed them before the schema (RESUME_FIXED, RESUMABLE_CHANGES)."""
    fixed = {f"data.{f.name}" for f in schema.section_fields("data") if schema.resume_refused(f"data.{f.name}")}
    assert fixed == {f"data.{name}" for name in schema.base_values()["data"]} - {
        "data.valid_path",
        "data.test_path",
        "data.eval_size",
    }
    train = {name for name in schema.base_values()["train"] if schema.resume_refused(f"train.{name}")}
    lora = {"lora_rank", "lora_alpha", "lora_scaling", "lora_targets", "lora_variant"}  # what the adapters are
    assert train == {"seed", "batch_size", "grad_accum", "optimizer", "decay_start", "init_from"} | lora
    assert set(schema.resumable_fields("model")) == {
        "dtype",
        "dropout",
        "attention_dropout",
        "attention_impl",
        "attention_block_q",
        "attention_block_kv",
        "matmul_precision",
        "remat",
    }


def source_workdir(path: Path) -> Path:
    """A workdir's config.json as a RoPE model's run writes it (adopt_source_model reads only that)."""
    config = config_lib.from_command_line(None, ["--config.model.positional=rope", "--config.model.d_model=64"])
    config.model.update(vocab_size=16, max_len=24)
    path.mkdir()
    config_lib.save(config, path)
    return path


def test_init_from_applies_a_model_flag_that_keeps_the_shapes(tmp_path):
    src = source_workdir(tmp_path / "src")
    flags = [f"--config.train.init_from={src}", "--config.model.rope_scaling=yarn", "--config.model.rope_factor=4"]
    flags += ["--config.model.rope_original_max_len=24", "--config.model.max_len=96", "--config.model.dtype=bfloat16"]
    config = config_lib.from_command_line(None, flags)
    m = config.model
    assert (m.rope_scaling, m.rope_factor, m.rope_original_max_len, m.max_len) == ("yarn", 4.0, 24, 96)
    assert (m.positional, m.d_model, m.vocab_size, m.dtype) == ("rope", 64, 16, "bfloat16")  # the source's, own dtype
    again = config_lib.adopt_source_model(config)  # what the run's edge does once more: the same model
    assert again is not None and config.model == m


def test_init_from_refuses_a_model_flag_that_changes_the_shapes_naming_it(tmp_path):
    src = source_workdir(tmp_path / "src")
    flags = [f"--config.train.init_from={src}", "--config.model.d_model=96", "--config.model.rope_factor=2"]
    flags += ["--config.model.rope_scaling=linear", "--config.model.num_layers=3"]
    with pytest.raises(config_lib.ConfigError) as e:
        config_lib.from_command_line(None, flags)
    line = str(e.value)
    assert "config.model.d_model=96 and config.model.num_layers=3" in line and "rope_" not in line
    assert "set --config.model.d_model=64 --config.model.num_layers=2 (the source's)" in line
