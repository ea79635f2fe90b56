"""`run.py import-gpt2 --from=DIR --workdir=DIR`: a Hugging Face GPT-2 folder -> a txjax training workdir.

The workdir is what `run.py train` writes (txjax.experiment.load_workdir reads it): config.json (the resolved
config, its model section GPT-2's), tokenizer/ (GPT-2's byte-level BPE) and checkpoints/ holding step 0 (the
imported parameters, fresh AdamW moments). So `run.py eval`, `run.py generate` and `run.py attention` work on it,
and training from it fine-tunes GPT-2. The data and train sections default to a small fine-tuning run on
tinyshakespeare (nanoGPT's finetune_shakespeare, shortened for a CPU); `--config=FILE` and `--config.a.b=value`
change them. Everything is read and checked before the workdir appears; a failure leaves nothing behind.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections

from txjax import config as config_lib
from txjax.checkpoint import Checkpointer
from txjax.convert.gpt2 import check_params, load_gpt2, load_gpt2_tokenizer, write_atomically
from txjax.experiment import CHECKPOINT_DIR, TOKENIZER_DIR, build_model
from txjax.models import ModelConfig, unstack_layers
from txjax.optim import make_optimizer
from txjax.train_state import TrainState, init_state


def run_config(cfg: ModelConfig, experiment: str | None = None, overrides=()) -> ml_collections.ConfigDict:
    """The run config of an imported GPT-2: model = cfg, then the experiment's data/train sections and overrides."""
    config = config_lib.load_config(experiment) if experiment else config_lib.base_config()
    if not experiment:
        config.data.update(kind="text", path="../shared/data/tinyshakespeare/input.txt", seq_len=min(256, cfg.max_len))
        config.train.update(steps=20, batch_size=4, learning_rate=3e-5, warmup_steps=2, weight_decay=0.0)
        config.train.update(eval_every=0, eval_batches=8, checkpoint_every=20, log_every=5)
    config.family = "decoder_lm"
    config.data.tokenizer = "byte_bpe"  # restored from the workdir's tokenizer/, never rebuilt
    config.model.update(dataclasses.asdict(cfg))
    for flag in overrides:
        config_lib.apply_override(config, flag)
    return config


def import_gpt2(source, workdir, experiment: str | None = None, overrides=()) -> dict:
    """Writes the workdir; returns a summary (workdir, parameter count, vocab size, context)."""
    hf_cfg, params = load_gpt2(source)
    tokenizer = load_gpt2_tokenizer(source)
    if tokenizer.vocab_size > hf_cfg.vocab_size:
        raise ValueError(
            f"{source}: the tokenizer has {tokenizer.vocab_size} ids, more than config.json's "
            f"vocab_size={hf_cfg.vocab_size}"
        )
    config = run_config(hf_cfg, experiment, overrides)
    cfg = config_lib.model_config(config.model.to_dict())
    if not cfg.scan_layers:
        params = unstack_layers(params)
    check_params(params, cfg)  # an override that changes a shape is an error here, before anything is written
    model, tx = build_model(config), make_optimizer(config.train)
    params = jax.tree.map(jnp.asarray, params)
    state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))
    expected = jax.eval_shape(lambda: init_state(model, tx, config.train.seed))
    if jax.tree.structure(state) != jax.tree.structure(expected):
        raise ValueError("the imported train state does not have the structure `run.py train` restores")

    def write(tmp: Path):
        config_lib.save(config, tmp)
        tokenizer.save(tmp / TOKENIZER_DIR)
        ckpt = Checkpointer(tmp / CHECKPOINT_DIR, config.train.keep_checkpoints)
        try:
            ckpt.save(0, state)
        finally:
            ckpt.close()

    path = write_atomically(workdir, write)
    return {
        "workdir": str(path),
        "params": sum(a.size for a in jax.tree.leaves(params)),
        "vocab_size": cfg.vocab_size,
        "max_len": cfg.max_len,
        "num_layers": cfg.num_layers,
    }
