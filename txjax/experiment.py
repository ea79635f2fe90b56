"""Config to run objects (tokenizer, datasets, model) and workdir back; top-level as training, decode, evaluate use it.

A workdir holds config.json (the resolved config), tokenizer/, checkpoints/ (orbax), metrics.jsonl, tb/,
curves.png and eval_<split>.json.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
from jax.sharding import Mesh

from txjax import config as config_lib
from txjax import data, families
from txjax.parallel.distributed import first_device_mesh
from txjax.state.checkpoint import Checkpointer
from txjax.state.lora import LoraConfig
from txjax.state.optim import OptimConfig, eval_params
from txjax.state.train_state import init_state, optimizer, state_shardings

BUILT_WITH = "built_with.json"  # in data.TOKENIZER_DIR: the data fields the tokenizer was built from
CHECKPOINT_DIR = "checkpoints"


def data_file(config: ml_collections.ConfigDict, split: str) -> Path:
    """The file a split reads: data.path, or valid_path / test_path where the kind has a file per split
    (data.KINDS: a text corpus has one file, split by val_fraction)."""
    d = config.data
    one_file = data.KINDS[d.kind].files == "file"
    path = d.path if one_file or split == "train" else {"valid": d.valid_path, "test": d.test_path}[split]
    if not path:
        raise config_lib.ConfigError(f"no {split} split: set --config.data.{split}_path=FILE")
    return data.resolve_path(
        config_lib.resolve_data_path(path),
        f"{split} data file",
        "--config.data.path" if path == d.path else f"--config.data.{split}_path",
    )


def data_folder(config: ml_collections.ConfigDict) -> Path:
    """The folder a kind of data.KINDS reads (files='folder': the prepared shards of `run.py prepare --output=DIR`)."""
    return config_lib.resolve_data_path(config.data.path)


def build_tokenizer(config: ml_collections.ConfigDict, workdir: Path) -> data.Tokenizer:
    """The workdir's tokenizer/ when there is one (resume, eval), else built from the training data and saved."""
    directory = Path(workdir) / data.TOKENIZER_DIR
    if (directory / data.TOKENIZER_FILE).is_file():
        check_tokenizer(config, directory)
        return data.load_tokenizer(directory)
    kind, own = config.data.tokenizer, data.KINDS[config.data.kind].tokenizer
    if own is not None:  # the tokenizer the data were prepared with (shards)
        tokenizer = own(data_folder(config))
    elif kind == "task":
        tokenizer = data.task_tokenizer()
    elif kind == "byte":
        tokenizer = data.ByteTokenizer()
    elif kind == "char":  # pairs need pad/bos/eos; a char LM keeps exactly the corpus' characters (nanoGPT)
        tokenizer = data.CharTokenizer.from_text(
            data.read_text(data_file(config, "train")), specials=data.KINDS[config.data.kind].pairs
        )
    elif kind in ("byte_bpe", "hf"):
        raise config_lib.ConfigError(
            f"data.tokenizer={kind!r} is read from {directory.resolve()}, which has no "
            f"{data.TOKENIZER_FILE}: create the workdir with `run.py import`, or set train.init_from"
        )
    else:  # one SentencePiece model shared by both sides of a parallel file (every tab-separated field)
        tokenizer = data.SentencePieceTokenizer.train_from_files([data_file(config, "train")], config.data.vocab_size)
    directory.mkdir(parents=True, exist_ok=True)  # the record first: a tokenizer is never without one
    (directory / BUILT_WITH).write_text(json.dumps(tokenizer_inputs(config)) + "\n")
    tokenizer.save(directory)
    return tokenizer


def tokenizer_inputs(config: ml_collections.ConfigDict) -> dict:
    """The data fields a workdir's tokenizer is built from (recorded beside it in BUILT_WITH)."""
    d = config.data
    read = {"char": ("path",), "sentencepiece": ("path", "vocab_size")}
    own = data.KINDS[d.kind].tokenizer is not None  # read from the data's folder
    names = ("kind", "tokenizer", *(("path",) if own else read.get(d.tokenizer, ())))
    return {f"data.{name}": d[name] for name in names}


def check_tokenizer(config: ml_collections.ConfigDict, directory: Path) -> None:
    """A tokenizer a run built (before its first checkpoint, maybe) fits the config as checkpoints must: a data
    field it was built from with another value is a ConfigError. One without the record (imported) is not checked."""
    record = directory / BUILT_WITH
    built = json.loads(record.read_text()) if record.is_file() else {}
    now = tokenizer_inputs(config)
    changed = [f"{k} {v!r} -> {now.get(k)!r}" for k, v in built.items() if now.get(k) != v]
    if changed:
        raise config_lib.ConfigError(
            f"{directory} was built for other data ({'; '.join(changed)}): pass the settings it was built with, "
            "or delete that folder to build it again from these"
        )


def build_dataset(config: ml_collections.ConfigDict, tokenizer: data.Tokenizer, split: str):
    """The dataset of one split, in the family's example form (Family.dataset); every one has .batch(seed, k,
    batch_size) and .eval_batches(batch_size)."""
    family = families.get(config.family)
    return family.dataset(_data_kind_dataset(config, tokenizer, split, family.data_kinds[config.data.kind]))


def _data_kind_dataset(config: ml_collections.ConfigDict, tokenizer: data.Tokenizer, split: str, form: str):
    """The dataset config.data.kind builds for one split (data.KINDS), its examples of `form` (Family.data_kinds)."""
    if split not in data.SPLITS:
        raise config_lib.ConfigError(f"unknown split {split!r}; choose one of {', '.join(data.SPLITS)}")
    kind = data.KINDS[config.data.kind]
    path = lambda: data_folder(config) if kind.files == "folder" else data_file(config, split)
    return kind.forms[form](config.data, split, form, tokenizer, path)


def fill_model_sizes(config: ml_collections.ConfigDict, tokenizer: data.Tokenizer, train_data) -> None:
    """Sets model.vocab_size and model.max_len left at 0 from the tokenizer and the longest sequence of the data."""
    longest = families.get(config.family).longest(config.data, train_data)
    m = config.model
    m.vocab_size = m.vocab_size or tokenizer.vocab_size
    m.max_len = m.max_len or longest
    if m.vocab_size < tokenizer.vocab_size or m.max_len < longest:
        raise config_lib.ConfigError(
            f"config.model.vocab_size={m.vocab_size}, max_len={m.max_len} are below the data's "
            f"{tokenizer.vocab_size} tokens and {longest} positions; leave them at 0 to fill them in"
        )


def build_model(config: ml_collections.ConfigDict, sow_weights: bool = False) -> nn.Module:
    """The model of the config's family (txjax.families), its ModelConfig validated."""
    return families.build(config.family, config_lib.model_config(config.model.to_dict()), sow_weights)


class TrainedRun(NamedTuple):
    """A trained run, as `run.py eval`, `generate` and `attention` start from it."""

    config: ml_collections.ConfigDict
    model: nn.Module  # DecoderLM | EncoderDecoder
    tokenizer: data.Tokenizer
    params: Any
    step: int
    averaged_steps: tuple[int, ...] = ()  # the checkpoints whose mean `params` is, when more than one

    @property
    def prompt_bos(self) -> bool:
        """Whether a generation's prompt starts with BOS, as the run's training sequences did (data.KINDS)."""
        return data.KINDS[self.config.data.kind].bos_first


def load_workdir(
    workdir: str | Path, step: int | None = None, mesh: Mesh | None = None, average: int = 1, merge: bool = True
) -> TrainedRun:
    """Config, tokenizer and the parameters of the latest (or `step`'s) checkpoint of a training workdir, laid out
    on `mesh` (default: the first device), whatever mesh and process count wrote them. average=N: the element-wise
    mean of the parameters of the N newest checkpoints (up to `step`), Vaswani et al. 2017 (section 6.1: "a single
    model obtained by averaging the last 5 checkpoints"); `step` is then the newest of them. A LoRA run's parameters
    are its merged weights, or with merge=False its base and adapters (txjax.state.lora.Adapted: what export writes
    as a peft adapter)."""
    if average < 1:
        raise config_lib.ConfigError(f"--average={average}: the number of checkpoints to average must be at least 1")
    workdir = Path(workdir)
    config = config_lib.load(workdir)
    try:  # a config.json edited by hand (or written before a range was checked): its field, before anything is read
        config_lib.validate(config, config, saved=True)
    except config_lib.ConfigError as e:
        raise config_lib.ConfigError(f"{workdir / config_lib.CONFIG_FILE}: {e}; correct it there") from None
    model = build_model(config)
    lora = LoraConfig.of(config.train)
    tx = optimizer(model, OptimConfig.of(config.train), lora)
    shardings = state_shardings(model, tx, config.train.seed, mesh or first_device_mesh(), lora)
    init = jax.jit(lambda: init_state(model, tx, config.train.seed, lora_config=lora), out_shardings=shardings)
    ckpt = Checkpointer(workdir / CHECKPOINT_DIR, config.train.keep_checkpoints)
    steps, total = [], None  # a running float32 sum: one restored state in memory at a time
    try:
        # the parameters alone (schedule-free AdamW's evaluation point needs its state too): no optimizer moments read
        only = () if config.train.optimizer == "schedule_free_adamw" else ("step", "params")
        for saved, state in ckpt.restore_newest(jax.eval_shape(init), average, step, only):
            params = eval_params(config.train.optimizer, state, merge)  # schedule-free AdamW's averaged point
            if average > 1:
                f32 = jax.tree.map(lambda leaf: leaf.astype(jnp.float32), params)
                total = f32 if total is None else jax.tree.map(jnp.add, total, f32)
            steps.append(saved)
    finally:
        ckpt.close()
    if average > 1:
        params = jax.tree.map(lambda summed, leaf: (summed / len(steps)).astype(leaf.dtype), total, params)
    tokenizer = data.load_tokenizer(workdir / data.TOKENIZER_DIR)
    return TrainedRun(config, model, tokenizer, params, steps[0], tuple(steps) if average > 1 else ())
