"""`train.init_from=WORKDIR`: start a run from another workdir's latest parameters (a model brought in with
`run.py import`, or any trained run) with a fresh optimizer: fine-tuning.

The run takes the source's model section and tokenizer (copied into its own workdir), keeping only its own values
of the fields that leave the parameters' shapes alone (config.RESUMABLE_CHANGES: dtype, dropout, remat, ...), so
the experiment file sets the family, the data, the training schedule and those, and nothing else has to be copied by
hand; a source of another family is refused (the experiment's data are its family's).
Once the run has a checkpoint of its own it resumes from that, as any run does.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections

from txjax import config as config_lib
from txjax import families
from txjax.data import TOKENIZER_DIR
from txjax.experiment import BUILT_WITH, load_workdir
from txjax.state.train_state import TrainState


def source(config: ml_collections.ConfigDict) -> Path:
    path = Path(config.train.init_from).expanduser()
    if not (path / config_lib.CONFIG_FILE).is_file():
        raise config_lib.ConfigError(
            f"train.init_from={config.train.init_from!r}: no {config_lib.CONFIG_FILE} in {path.resolve()} (create "
            "it with `run.py import --from=CHECKPOINT --workdir=DIR`, or point it at a trained run's workdir)"
        )
    return path


def adopt_model(config: ml_collections.ConfigDict, workdir: Path, lead: bool = True) -> None:
    """config.model and data.tokenizer become the source's (but the RESUMABLE_CHANGES fields), a ConfigError when the
    source is of another family than config.family; the lead process
    copies the source's tokenizer/ into `workdir` unless the run already has one (not what the source built it from:
    this run's data differ)."""
    src = source(config)
    saved = config_lib.load(src)
    if saved.family != config.family:  # the experiment's data are the run's family's: never switched under them
        kinds = ", ".join(families.get(saved.family).data_kinds)
        raise config_lib.ConfigError(
            f"train.init_from={config.train.init_from!r} holds a {saved.family} model ({src / config_lib.CONFIG_FILE}"
            f"), this run is config.family={config.family!r}: fine-tune it with --config.family={saved.family} and "
            f"data it reads (data.kind {kinds}), or start from a workdir of family {config.family}"
        )
    keep = {name: config.model[name] for name in config_lib.RESUMABLE_CHANGES}
    config.model.update({**saved.model.to_dict(), **keep})
    config.data.tokenizer = saved.data.tokenizer
    config_lib.model_config(config.model.to_dict())
    if lead and not (workdir / TOKENIZER_DIR).exists():
        shutil.copytree(src / TOKENIZER_DIR, workdir / TOKENIZER_DIR, ignore=shutil.ignore_patterns(BUILT_WITH))


def source_params(path, mesh=None):
    """The latest parameters of the workdir at `path`, laid out on `mesh` (default: the first device)."""
    return load_workdir(path, mesh=mesh).params


def fresh_state(params, tx) -> TrainState:
    """Step 0 at `params`, with fresh optimizer moments."""
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))


def initial_state(path, tx, mesh, shardings) -> TrainState:
    """fresh_state at the source's parameters, laid out as `shardings` (the run's state shardings on `mesh`)."""
    return jax.jit(lambda p: fresh_state(p, tx), out_shardings=shardings)(source_params(path, mesh))
