"""Experiment configs, top-level as every wing's settings meet here: `experiments/NAME.py` files, overrides, checks.

An experiment file starts from `base_config()` (every field that exists, with its default) and changes a few; the
ConfigDict is locked, so a misspelt field fails in the file as on the command line. Everything a user can get wrong
is checked here, before any data is read or anything compiles, and reported as one `ConfigError` line.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import difflib
import importlib.util
import json
from pathlib import Path

import ml_collections

from txjax import families, ranges, unread
from txjax.data import kinds, tokenizers
from txjax.decode.strategy import METHODS, OPTION_DEFAULTS
from txjax.errors import ConfigError
from txjax.model.config import ModelConfig
from txjax.ops import profiling
from txjax.ops.provenance import REPO
from txjax.ops.trackers import TRACKERS
from txjax.state import optim

DEFAULT_EXPERIMENT = REPO / "experiments" / "reverse.py"
TOKENIZERS = (*tokenizers.TOKENIZER_KINDS, "task")  # byte_bpe, hf: from the workdir (import); task: synthetic
CONFIG_FILE = "config.json"
HISTORY = "history"  # config.json's list of the settings resumed runs changed (txjax.training.resume)


def base_config() -> ml_collections.ConfigDict:
    """Every field an experiment can set, with its default (README.md, "Experiments")."""
    model = {f.name: f.default for f in dataclasses.fields(ModelConfig) if f.default is not dataclasses.MISSING}
    model |= {"vocab_size": 0, "max_len": 0}  # 0: filled in from the tokenizer and the data's longest sequence
    config = ml_collections.ConfigDict(
        {
            "family": families.DECODER_LM.name,
            "model": model,
            "data": {
                "kind": "synthetic",
                "path": "",  # text / parallel training file, or the shards folder; relative: see resolve_data_path
                "valid_path": "",  # parallel: validation TSV
                "test_path": "",  # parallel: test TSV
                "task": "reverse",  # synthetic: copy | reverse | sort | add | passkey (max_digits: its context)
                "min_digits": 1,
                "max_digits": 8,
                "eval_size": 512,  # synthetic: examples in the valid (and test) set
                "tokenizer": "task",  # char | byte | sentencepiece | task (synthetic); shards bring their own
                "vocab_size": 8000,  # sentencepiece
                "seq_len": 64,  # text: tokens per training window
                "val_fraction": 0.1,  # text: the last 10% of the file is the valid split (nanoGPT)
                "max_src_len": 128,
                "max_tgt_len": 128,
                "pack": False,  # parallel: several pairs per row; shards: documents packed (no attention across)
            },
            "train": {
                "steps": 1000,  # optimizer steps; with decay_start="budget" the most the budget may take
                "batch_size": 32,  # examples per optimizer step (split into grad_accum micro-batches)
                "grad_accum": 1,
                "learning_rate": 1e-3,
                "optimizer": "adamw",  # adamw | lion | adafactor | muon | schedule_free_adamw (txjax.state.optim)
                "schedule": "cosine",  # cosine | linear | constant | wsd, each after a linear warmup
                "decay_fraction": 0.2,  # wsd: the last 20% of the steps after warmup decay linearly
                "decay_start": "steps",  # wsd: "budget" decays over the last decay_fraction of max_minutes (budget)
                "min_lr_ratio": 0.1,  # the schedule ends at learning_rate * min_lr_ratio
                "warmup_steps": 100,
                "weight_decay": 0.1,
                "b1": 0.9,
                "b2": 0.99,
                "grad_clip": 1.0,  # global-norm clipping; 0 disables it
                "label_smoothing": 0.0,
                "z_loss": 0.0,  # coefficient of logsumexp(z)^2 in the objective (PaLM's 1e-4); 0 = off
                "moe_aux_weight": 0.01,  # MoE (model.num_experts > 0): the balance loss's weight (Switch's 0.01)
                "moe_z_weight": 0.0,  # MoE: the router z-loss's weight (ST-MoE's 1e-3); 0 = off
                "moe_bias_rate": 0.0,  # MoE, router 'sigmoid': DeepSeek-V3's bias balancing step (its 1e-3); 0 = off
                "seed": 0,
                "log_every": 50,
                "eval_every": 500,  # 0: only at the end
                "eval_batches": 20,  # batches of the valid split per periodic eval; the final eval reads it all
                "checkpoint_every": 500,
                "keep_checkpoints": 3,
                "max_minutes": 0.0,  # training-time budget (evals and saves not counted); 0 = none. Stops cleanly:
                # checkpoint + final eval
                "eval_every_minutes": 0.0,  # also evaluate every this many minutes of training time; 0 = by steps only
                "profile_steps": "",  # "A:B": a jax.profiler trace of steps A+1..B in WORKDIR/profile (ops.profiling)
                "eval_generation": False,  # evals also decode the valid split: BLEU/chrF (greedy) or exact match
                "init_from": "",  # a workdir (run.py import) whose parameters, model and tokenizer start this run
                "trackers": ["jsonl", "tensorboard"],  # + wandb | mlflow (txjax.ops.trackers); jsonl always
            },
            "mesh": {
                "data": 1,
                "fsdp": 1,
                "sequence": 1,
                "tensor": 1,
                "expert": 1,  # expert parallelism: the experts split over it, the batch rows too (model.num_experts)
            },  # txjax.parallel.sharding; sequence: ring attention
            "decode": {  # txjax.decode.strategy: method greedy | sample | beam, each with its own options
                "method": "greedy",
                "max_new_tokens": 64,
                **OPTION_DEFAULTS,  # the options of each method (METHOD_OPTIONS) and their defaults, defined there
                "prefill_chunk": 0,  # feed the prompt this many tokens per call (0 = all at once): long prompts
            },
        }
    )
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


def validate(config: ml_collections.ConfigDict, defaults: ml_collections.ConfigDict | None = None) -> None:
    """Checks every value that can be checked before data is read (model fields included). A field the config's
    settings leave unread (txjax.unread) is refused when its value differs from `defaults`' (what the user did not
    set: base_config() by default, a workdir's saved config for a run resumed or evaluated from it)."""
    choices = {
        "family": (config.family, tuple(families.FAMILIES)),
        "data.kind": (
            config.data.kind,
            tuple(dict.fromkeys(k for f in families.FAMILIES.values() for k in f.data_kinds)),
        ),
        "data.tokenizer": (config.data.tokenizer, TOKENIZERS),
        "decode.method": (config.decode.method, METHODS),
        "train.optimizer": (config.train.optimizer, optim.OPTIMIZERS),
        "train.schedule": (config.train.schedule, optim.SCHEDULES),
        "train.decay_start": (config.train.decay_start, ("steps", "budget")),
    }
    for name, (value, allowed) in choices.items():
        if value not in allowed:
            close = difflib.get_close_matches(str(value), allowed, n=1)
            raise ConfigError(
                f"config.{name}={value!r} is not one of {', '.join(allowed)}"
                + (f"; did you mean {close[0]!r}?" if close else "")
            )
    ranges.check_numbers(config)  # every number in its range (the model's: ModelConfig below)
    t = config.train
    if t.batch_size % t.grad_accum:
        raise ConfigError(f"config.train.batch_size={t.batch_size} must be divisible by grad_accum={t.grad_accum}")
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
    for name in ("moe_aux_weight", "moe_z_weight", "moe_bias_rate"):
        if t[name] < 0:
            raise ConfigError(f"config.train.{name}={t[name]} must be >= 0 (0 = off)")
    if config.data.kind not in families.get(config.family).data_kinds:  # its kinds are kinds.KINDS'
        raise ConfigError(f"config.data.kind={config.data.kind!r} does not fit config.family={config.family!r}")
    if kinds.KINDS[config.data.kind].files and not config.data.path:
        raise ConfigError(f"config.data.kind={config.data.kind!r} needs --config.data.path=FILE")
    model_config({**config.model.to_dict(), **{k: config.model[k] or 1 for k in ("vocab_size", "max_len")}})
    validate_sequence_axis(config)
    validate_expert_axis(config)
    families.get(config.family).check(config)  # what the family cannot run
    if refused := unread.refusal(config, defaults or base_config()):
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
    splits into the zig-zag layout's 2n chunks, with no attention dropout, no ALiBi, no local window and no score
    soft-capping (the ring has none)."""
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
    if m.get("attention_softcap", 0):
        raise ConfigError(
            f"config.mesh.sequence={n} (ring attention) has no score soft-capping: set model.attention_softcap=0"
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
    validate(config, load(workdir) if from_workdir else None)
    return config


RESUMABLE_CHANGES = (
    "dtype",
    "dropout",
    "attention_dropout",
    "attention_impl",
    "attention_block_q",
    "attention_block_kv",
    "matmul_precision",
    "remat",
)  # the state's shapes stay
# what batch k is (data, seed, batch shape) and what the optimizer state holds (optimizer, a budget's plan): a resumed
# run with other values would not continue the run it resumes
RESUME_FIXED = {
    "data": (
        "kind",
        "path",
        "task",
        "min_digits",
        "max_digits",
        "tokenizer",
        "vocab_size",
        "seq_len",
        "val_fraction",
        "max_src_len",
        "max_tgt_len",
        "pack",
    ),
    "train": ("seed", "batch_size", "grad_accum", "optimizer", "decay_start", "init_from"),
}  # every other field applies from the resume step (txjax.training.resume)


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
