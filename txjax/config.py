"""Experiment configs, top-level as every wing's settings meet here: `experiments/NAME.py` files, overrides, checks.

An experiment file starts from `base_config()` (every field that exists, with its default: each section's schema,
txjax.sections) and changes a few; the ConfigDict is locked, so a misspelt field fails in the file as on the command
line. Everything a user can get wrong is checked here, before any data is read or anything compiles, and reported as
one `ConfigError` line. A run fine-tuning another workdir (train.init_from) takes that workdir's model section here,
with the flags that keep its parameters' shapes (adopt_source_model), before it is validated.
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import importlib.util
import json
from pathlib import Path

import jax
import ml_collections

from txjax import families, ranges, unread
from txjax.data import kinds
from txjax.errors import ConfigError
from txjax.model.config import ModelConfig
from txjax.ops import profiling
from txjax.ops.provenance import REPO
from txjax.ops.trackers import TRACKERS
from txjax.sections import schema
from txjax.state import lora, optim

DEFAULT_EXPERIMENT = REPO / "experiments" / "reverse.py"
CONFIG_FILE = "config.json"
HISTORY = "history"  # config.json's list of the settings resumed runs changed (txjax.training.resume)


def base_config() -> ml_collections.ConfigDict:
    """Every field an experiment can set, with its default (README.md, "Experiments"; each section's schema:
    txjax.sections)."""
    config = ml_collections.ConfigDict(schema.base_values())
    config.lock()
    return config


def load_config(path: str | Path | None = None) -> ml_collections.ConfigDict:
    """`get_config()` of an experiment file (default: the embedded default experiment)."""
    path = Path(path or DEFAULT_EXPERIMENT)
    if not path.is_file():
        found = sorted(p.name for p in (REPO / "experiments").glob("*.py"))
        raise ConfigError(f"experiment file not found: {path.resolve()} (experiments/ has {', '.join(found)})")
    spec = importlib.util.spec_from_file_location(f"experiment_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
        return module.get_config()
    except AttributeError as e:  # a locked ConfigDict refuses a misspelt field
        raise ConfigError(f"{path}: {e}") from None


def _parse(text: str, current):
    """A flag's text as the type of the field it overrides."""
    if isinstance(current, bool):
        if text.lower() not in ("true", "false", "1", "0"):
            raise ValueError("expected true or false")
        return text.lower() in ("true", "1")
    if (
        text == "None" and isinstance(current, int | float) and not isinstance(current, bool)
    ):  # a field whose default is None (model.d_head, ...)
        return None
    if isinstance(current, float):
        return float(text)
    if isinstance(current, int):  # 1e4 is fine, 1e-3 and 1.5 are not
        value = float(text) if "e" in text.lower() else int(text)
        if value != int(value):
            raise ValueError(text)
        return int(value)
    if isinstance(current, str):
        return text
    if isinstance(current, list):  # a,b,c or a Python list literal
        if text.lstrip().startswith("["):
            return list(ast.literal_eval(text))
        return [item.strip() for item in text.split(",") if item.strip()]
    try:  # a None default (e.g. model.num_kv_heads) takes any literal, else the raw string
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def apply_override(config: ml_collections.ConfigDict, flag: str) -> None:
    """Applies one `--config.section.field=value` flag in place; an unknown key names its close matches."""
    name, eq, text = flag.removeprefix("--").partition("=")
    keys = name.split(".")[1:]
    if not eq or not keys or not name.startswith("config."):
        raise ConfigError(f"{flag}: expected --config.section.field=value")
    node = config
    for depth, key in enumerate(keys):
        if not isinstance(node, ml_collections.ConfigDict) or key not in node:
            known = list(node.keys()) if isinstance(node, ml_collections.ConfigDict) else []
            close = difflib.get_close_matches(key, known, n=3)
            where = ".".join(["config", *keys[:depth]])
            hint = f"did you mean {', '.join(close)}?" if close else f"{where} has {', '.join(known) or 'no fields'}"
            raise ConfigError(f"--config.{'.'.join(keys)}: unknown key {key!r}; {hint}")
        if depth < len(keys) - 1:
            node = node[key]
    current = node[keys[-1]]
    if isinstance(current, ml_collections.ConfigDict):
        raise ConfigError(f"{flag}: config.{'.'.join(keys)} is a section; set one of its fields")
    try:
        node[keys[-1]] = _parse(text, current)
    except (ValueError, TypeError):
        expected = type(current).__name__
        raise ConfigError(f"{flag}: expected {expected} (config.{'.'.join(keys)} = {current!r})") from None


@contextlib.contextmanager
def user_errors():
    """Turns the data package's one-line errors (missing file, unencodable text, split too short) into ConfigErrors."""
    try:
        yield
    except (FileNotFoundError, ValueError) as e:
        raise ConfigError(str(e)) from None


def model_config(model: dict) -> ModelConfig:
    """ModelConfig from the config's model section (vocab_size, max_len filled); a bad value is a ConfigError."""
    try:
        return ModelConfig.from_dict(model)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def validate(
    config: ml_collections.ConfigDict, defaults: ml_collections.ConfigDict | None = None, saved: bool = False
) -> None:
    """Checks every value that can be checked before data is read (model fields included). A field the config's
    settings leave unread (txjax.unread) is refused when its value differs from `defaults`' (what the user did not
    set: base_config() by default, a workdir's saved config for a run resumed or evaluated from it, `saved` true,
    which the refusal's line says); every such field, bad choice and number out of range is named in one line."""
    bad = []
    for name, allowed in schema.choices().items():
        value = unread.setting_value(config, name)
        if value not in allowed:
            close = difflib.get_close_matches(str(value), list(allowed), n=1)
            bad.append(
                f"config.{name}={value!r} is not one of {', '.join(allowed)}"
                + (f" (did you mean {close[0]!r}?)" if close else "")
            )
    if bad:  # every one in one line
        raise ConfigError("; ".join(bad))
    ranges.check_numbers(config)  # every number in its range (the model's: ModelConfig below)
    t = config.train
    try:
        profiling.parse_steps(t.profile_steps)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    budget_wsd = t.schedule == "wsd" and t.max_minutes > 0 and t.optimizer != "schedule_free_adamw"
    if t.decay_start == "budget" and not budget_wsd:
        raise ConfigError("config.train.decay_start='budget' needs train.schedule=wsd and train.max_minutes > 0")
    if config.model.parametrization == "mup" and t.optimizer not in optim.MUP_OPTIMIZERS:
        raise ConfigError(
            f"config.model.parametrization='mup' supports train.optimizer {' or '.join(optim.MUP_OPTIMIZERS)}, "
            f"not {t.optimizer!r}"
        )
    validate_trackers(t.trackers)
    if t.lora_rank:
        lora.check_targets(t.lora_targets)
        if t.moe_bias_rate:  # the router's bias is the base's, frozen
            raise ConfigError("config.train.moe_bias_rate balances a frozen router under LoRA: set it to 0")
    if config.data.kind not in families.get(config.family).data_kinds:  # its kinds are kinds.KINDS'
        raise ConfigError(f"config.data.kind={config.data.kind!r} does not fit config.family={config.family!r}")
    if kinds.KINDS[config.data.kind].files and not config.data.path:
        raise ConfigError(f"config.data.kind={config.data.kind!r} needs --config.data.path=FILE")
    model_config({**config.model.to_dict(), **{k: config.model[k] or 1 for k in ("vocab_size", "max_len")}})
    validate_sequence_axis(config)
    validate_expert_axis(config)
    families.get(config.family).check(config)  # what the family cannot run
    ranges.check_batch_split(config)  # after the mesh axes' own checks: it names them
    if refused := unread.refusal(config, defaults or base_config(), saved):
        raise ConfigError(refused)


def validate_trackers(trackers) -> None:
    """train.trackers: known names (txjax.ops.trackers.TRACKERS), jsonl among them (metrics.jsonl is the run's own
    record: a resume, the evals it owes and a sweep's report read it)."""
    unknown = [name for name in trackers if name not in TRACKERS]
    if unknown or "jsonl" not in trackers or len(set(trackers)) != len(trackers):
        problem = f"unknown {', '.join(map(repr, unknown))}" if unknown else "jsonl missing or a name repeated"
        raise ConfigError(
            f"config.train.trackers={list(trackers)!r}: {problem}; the known ones: jsonl (always), "
            f"{', '.join(TRACKERS[1:])}, e.g. --config.train.trackers=jsonl,tensorboard,wandb"
        )


def validate_sequence_axis(config: ml_collections.ConfigDict) -> None:
    """mesh.sequence = n > 1 (ring attention over n devices, txjax.model.ring_attention): a decoder LM whose context
    splits into the zig-zag layout's 2n chunks, with no attention dropout, no ALiBi, no local window, no chunked
    attention, no score soft-capping (the ring has none) and no multi-token prediction."""
    n, m = config.mesh.sequence, config.model
    if not isinstance(n, int) or n < 1:
        raise ConfigError(f"config.mesh.sequence={n!r} must be a positive integer")
    if n == 1:
        return
    if not families.get(config.family).ring_attention:
        serves = ", ".join(name for name, f in families.FAMILIES.items() if f.ring_attention)
        raise ConfigError(f"config.mesh.sequence={n} (ring attention) serves family {serves}, not {config.family!r}")
    if kinds.KINDS[config.data.kind].windows and config.data.seq_len % (2 * n):
        raise ConfigError(
            f"config.data.seq_len={config.data.seq_len} must divide into 2 * mesh.sequence = {2 * n} chunks "
            "(ring attention's zig-zag layout)"
        )
    if m.attention_dropout > 0 or m.positional == "alibi":
        raise ConfigError(
            f"config.mesh.sequence={n} (ring attention) has no attention dropout and no ALiBi: set "
            "model.attention_dropout=0 and another model.positional"
        )
    if m.get("attention_window", 0):
        raise ConfigError(
            f"config.mesh.sequence={n} (ring attention) has no local window: set model.attention_window=0"
        )
    if m.get("attention_chunk", 0):
        raise ConfigError(
            f"config.mesh.sequence={n} (ring attention) has no chunked attention: set model.attention_chunk=0"
        )
    if m.get("attention_softcap", 0):
        raise ConfigError(
            f"config.mesh.sequence={n} (ring attention) has no score soft-capping: set model.attention_softcap=0"
        )
    if m.get("mtp_depth", 0):  # its depths' targets lie k places on, across the zig-zag layout's chunks
        raise ConfigError(
            f"config.mesh.sequence={n} (ring attention) has no multi-token prediction: set model.mtp_depth=0"
        )


def validate_expert_axis(config: ml_collections.ConfigDict) -> None:
    """mesh.expert = n > 1 (expert parallelism, txjax.parallel.expert_parallel): an MoE model whose experts split
    evenly over the n devices of an expert group."""
    n, experts = config.mesh.expert, config.model.num_experts
    if n == 1:
        return
    if not experts:
        raise ConfigError(f"config.mesh.expert={n} splits experts: set model.num_experts > 0 or mesh.expert=1")
    if experts % n:
        raise ConfigError(f"config.model.num_experts={experts} must be divisible by mesh.expert={n}")
    if config.model.get("moe_gate_input"):
        raise ConfigError(
            f"config.mesh.expert={n} gates the experts' outputs: set model.moe_gate_input=false or mesh.expert=1"
        )


def resolve_data_path(path: str) -> Path:
    """A data file's path: absolute, or relative to the working directory, else to the repo root (where the
    experiments' `../shared/data/...` defaults point). A missing file fails later, naming the repo-root path."""
    p = Path(path).expanduser()
    return p.resolve() if p.is_absolute() or p.exists() else (REPO / p).resolve()


def from_command_line(
    experiment: str | None, overrides: list[str], workdir: Path | None = None
) -> ml_collections.ConfigDict:
    """Experiment file + overrides, validated: the config a run starts from. Without an experiment file, a workdir
    that already holds a config.json (a resumed or imported run, e.g. `run.py import`) starts from that one."""
    from_workdir = experiment is None and workdir is not None and (Path(workdir) / CONFIG_FILE).is_file()
    config = load(workdir) if from_workdir else load_config(experiment)
    for flag in overrides:
        apply_override(config, flag)
    defaults = load(workdir) if from_workdir else None
    if not from_workdir and (source := adopt_source_model(config)) is not None:  # a fine-tune's flags on its model
        defaults = base_config()
        defaults.model.update(source.model.to_dict())
        defaults.data.tokenizer = source.data.tokenizer
    validate(config, defaults, saved=from_workdir)
    return config


def source_workdir(config: ml_collections.ConfigDict) -> Path:
    """train.init_from's workdir, or a ConfigError naming how to make one."""
    path = Path(config.train.init_from).expanduser()
    if not (path / CONFIG_FILE).is_file():
        raise ConfigError(
            f"train.init_from={config.train.init_from!r}: no {CONFIG_FILE} in {path.resolve()} (create "
            "it with `run.py import --from=CHECKPOINT --workdir=DIR`, or point it at a trained run's workdir)"
        )
    return path


def adopt_source_model(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict | None:
    """train.init_from=WORKDIR: config.model and data.tokenizer become the source's, but for the run's own values of
    the fields a resume may change (dtype, dropout, remat, ...) and of every model field the run sets (its value
    is not base_config's) that leaves the parameters' shapes alone (rope_scaling for a longer context, a window,
    ...), as a resume applies them. Returns the source's config (None without init_from); a ConfigError names the
    fields that would change the shapes, or a source of another family than config.family."""
    if not config.train.init_from:
        return None
    src = source_workdir(config)
    saved = load(src)
    if saved.family != config.family:  # the experiment's data are the run's family's: never switched under them
        kinds_read = ", ".join(families.get(saved.family).data_kinds)
        raise ConfigError(
            f"train.init_from={config.train.init_from!r} holds a {saved.family} model ({src / CONFIG_FILE}), this "
            f"run is config.family={config.family!r}: fine-tune it with --config.family={saved.family} and data it "
            f"reads (data.kind {kinds_read}), or start from a workdir of family {config.family}"
        )
    defaults, source = base_config().model, saved.model.to_dict()
    own = {k: config.model[k] for k in schema.resumable_fields("model")}
    sets = {k: v for k, v in config.model.items() if k not in own and v not in (defaults[k], source[k])}
    base = _param_shapes(config.family, source)
    if _param_shapes(config.family, source | sets) != base:
        alone = {k: _param_shapes(config.family, source | {k: sets[k]}, failed=base) for k in sets}
        shaping = [k for k, shapes in alone.items() if shapes != base] or list(sets)  # or only together
        raise ConfigError(
            f"train.init_from={config.train.init_from!r} starts from its parameters, whose shapes "
            + " and ".join(f"config.model.{k}={sets[k]!r}" for k in shaping)
            + f" would change: set {' '.join(f'--config.model.{k}={unread.flag_text(source[k])}' for k in shaping)} "
            "(the source's), or train without train.init_from"
        )
    config.model.update(source | sets | own)
    config.data.tokenizer = saved.data.tokenizer
    model_config(config.model.to_dict())
    return saved


def _param_shapes(family: str, model: dict, failed=...):
    """The parameters' shapes of a model section (`failed` where it is no valid model, else its ConfigError)."""
    try:
        module = families.build(family, model_config(model))
    except ConfigError:
        if failed is ...:
            raise
        return failed
    return jax.tree.map(lambda a: a.shape, jax.eval_shape(lambda: families.init_params(module, jax.random.key(0))))


def save(config: ml_collections.ConfigDict, workdir: Path, history: list | None = None) -> None:
    """Writes config.json: the config and, under "history", the settings a resumed run changed
    (txjax.training.resume)."""
    write(config.to_json(), workdir, history)


def write(config: str, workdir: Path, history: list | None = None) -> None:
    """save, of the config's JSON (ConfigDict.to_json)."""
    saved = json.loads(config) | ({HISTORY: history} if history else {})
    (Path(workdir) / CONFIG_FILE).write_text(json.dumps(saved, indent=1) + "\n")


def history(workdir: Path) -> list:
    """config.json's "history": [{"step": s, "changes": {field: [old, new]}}, ...], one entry per resume that
    changed a setting."""
    path = Path(workdir) / CONFIG_FILE
    return json.loads(path.read_text()).get(HISTORY, []) if path.is_file() else []


def load(workdir: Path) -> ml_collections.ConfigDict:
    """The resolved config a run wrote into its workdir, on top of today's defaults (so a field added since the run
    was trained reads as its default)."""
    path = Path(workdir) / CONFIG_FILE
    if not path.is_file():
        raise ConfigError(f"no {CONFIG_FILE} in {Path(workdir).resolve()}: is it the workdir of a `run.py train`?")

    def merged(defaults: dict, saved: dict) -> dict:
        return defaults | {
            k: merged(defaults[k], v) if isinstance(defaults.get(k), dict) else v for k, v in saved.items()
        }

    saved = json.loads(path.read_text())
    saved.pop(HISTORY, None)
    for retired in ("fused_projections", "decoding_layout", "out_major"):  # decoding layouts: txjax.decode.kernels
        saved.get("model", {}).pop(retired, None)
    return ml_collections.ConfigDict(merged(base_config().to_dict(), saved))
