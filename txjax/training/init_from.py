"""`train.init_from=WORKDIR`: start a run from another workdir's latest parameters (a model brought in with
`run.py import`, or any trained run) with a fresh optimizer: fine-tuning.

The run takes the source's model section and tokenizer (copied into its own workdir), keeping its own values of the
fields a resume may change (dtype, dropout, remat, ...) and of the model fields it sets that leave the parameters'
shapes alone (e.g. `--config.model.rope_scaling=yarn` for a longer context): those apply, as a resume applies its
changes, and one that would change a shape is refused in one line (txjax.config.adopt_source_model). So the
experiment file sets the family, the data, the training schedule and those, and nothing else has to be copied by
hand; a source of another family is refused (the experiment's data are its family's).
Once the run has a checkpoint of its own it resumes from that, as any run does.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import jax
import ml_collections

from txjax import config as config_lib
from txjax.data import TOKENIZER_DIR
from txjax.experiment import BUILT_WITH, load_workdir
from txjax.state.train_state import TrainState, start_state


def adopt_model(config: ml_collections.ConfigDict, workdir: Path, lead: bool = True) -> None:
    """config.model and data.tokenizer become the source's, with the run's own settings that leave the parameters'
    shapes alone (txjax.config.adopt_source_model: a ConfigError for the others, or for a source of another
    family); the lead process copies the source's tokenizer/ into `workdir` unless the run already has one (not
    what the source built it from: this run's data differ)."""
    config_lib.adopt_source_model(config)
    src = config_lib.source_workdir(config)
    if lead and not (workdir / TOKENIZER_DIR).exists():
        shutil.copytree(src / TOKENIZER_DIR, workdir / TOKENIZER_DIR, ignore=shutil.ignore_patterns(BUILT_WITH))


def source_params(path, mesh=None):
    """The latest parameters of the workdir at `path`, laid out on `mesh` (default: the first device)."""
    return load_workdir(path, mesh=mesh).params


def initial_state(path, tx, mesh, shardings, model, seed: int, lora_config) -> TrainState:
    """Step 0 at the source's parameters (train_state.start_state: LoRA's adapters beside them when on, fresh
    moments), laid out as `shardings` (the run's state shardings on `mesh`)."""
    start = lambda p: start_state(p, tx, model, seed, lora_config)
    return jax.jit(start, out_shardings=shardings)(source_params(path, mesh))
