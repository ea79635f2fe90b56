"""The edge of training: a run's validated config resolved against its workdir once, under the workdir's lock
(txjax.training.loop.drive), into RunSpec, the frozen record of typed values the run reads from there on. Resolving
adopts train.init_from's model and tokenizer, builds (or reads) the tokenizer and saves it in the workdir, makes the
datasets and fills in the model's sizes; the ConfigDict goes no further than RunSpec.config, its JSON, which is what
config.json holds and the resume check compares (txjax.training.resume).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import ml_collections
import optax

from txjax import config as config_lib
from txjax import families
from txjax.data import KINDS
from txjax.experiment import build_dataset, build_tokenizer, fill_model_sizes
from txjax.model.config import ModelConfig
from txjax.ops import trackers
from txjax.parallel.distributed import barrier, is_lead
from txjax.sections.mesh import MeshShape
from txjax.sections.train import TrainConfig
from txjax.state.optim import HYPERPARAMS
from txjax.state.train_state import init_state
from txjax.training import init_from

VMAPPABLE = ("train.seed",) + tuple(f"train.{name}" for name in HYPERPARAMS)


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One run's settings, resolved against its workdir: what Run (txjax.training.run) reads of its config."""

    workdir: Path
    family: str
    model: ModelConfig  # vocab_size and max_len filled in
    train: TrainConfig
    mesh: MeshShape
    decode: Mapping[str, Any]  # config.decode, read-only: the evals' generation strategy (eval_generation)
    exact_match: bool  # synthetic data: its evals score a generated answer whole
    group: str | None  # group_key: runs of equal groups may be stacked
    config: str  # the resolved config's JSON, as config.json holds it


def prepare_run(config: ml_collections.ConfigDict, workdir: Path) -> tuple[RunSpec, tuple]:
    """(RunSpec, (tokenizer, train, valid)) of a run; the tokenizer saved in `workdir`, train.init_from's model
    section and the model sizes filled into `config`."""
    workdir.mkdir(parents=True, exist_ok=True)
    trackers.check_installed(
        config.train.trackers
    )  # a missing package (the track extra) fails before anything is built
    if config.train.get("init_from"):  # fine-tuning: the source's model section and tokenizer
        init_from.adopt_model(config, workdir, lead=is_lead())
        barrier("init_from")
    with config_lib.user_errors():
        tokenizer = build_tokenizer(config, workdir) if is_lead() else None
        barrier("tokenizer")  # the other processes load the one process 0 built and saved
        tokenizer = build_tokenizer(config, workdir) if tokenizer is None else tokenizer
        train_data = build_dataset(config, tokenizer, "train")
        valid_data = build_dataset(config, tokenizer, "valid")
        fill_model_sizes(config, tokenizer, train_data)
    spec = RunSpec(
        workdir=workdir,
        family=config.family,
        model=config_lib.model_config(config.model.to_dict()),
        train=TrainConfig.of(config.train),
        mesh=MeshShape(**config.mesh.to_dict()),
        decode=types.MappingProxyType(config.decode.to_dict()),
        exact_match=KINDS[config.data.kind].exact_match,
        group=group_key(config),
        config=config.to_json(),
    )
    if spec.train.lora.lora_rank:  # its targets and rank against the model's weights: a ConfigError before training
        model = families.build(spec.family, spec.model)
        jax.eval_shape(functools.partial(init_state, model, optax.identity(), 0, lora_config=spec.train.lora))
    return spec, (tokenizer, train_data, valid_data)


def group_key(config: ml_collections.ConfigDict) -> str | None:
    """Runs whose configs have equal keys can be stacked (txjax.training.stack): they differ only in VMAPPABLE
    fields. None for a run that cannot share a program (a mesh of several devices or several processes: stacked
    runs live on one device)."""
    if math.prod(config.mesh.values()) > 1 or jax.process_count() > 1:
        return None
    shared = config.to_dict()
    for field in VMAPPABLE:
        section, name = field.split(".")
        del shared[section][name]
    return json.dumps(shared, sort_keys=True)
