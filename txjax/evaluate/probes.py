"""Measurements of a trained decoder LM beyond its eval loss, run on its workdir after training (sweep `probes`).

- attention_entropy: mean over layers, heads, examples and query positions of the entropy of each attention
  distribution, H = -sum_j p_j log p_j (nats), on the first eval batch of the valid split. A query at position i
  sees i + 1 keys, so H <= log(i + 1); spiky (near one-hot) attention has H near 0.
- context_lengths: valid loss with windows of 2x and 4x the training context (positions the model never saw in
  training), for encodings that are defined there (all but the learned table).
- test_split (any family): what `run.py eval --split=test` measures (its loss, and its translations' BLEU and chrF
  with the run's decode section, e.g. beam 4, or a synthetic task's greedy exact match), also written to the run's
  eval_test.json.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp

from txjax.data import TextLMDataset
from txjax.evaluate.split import eval_batches, evaluate, make_eval_step, split_metrics, write_metrics
from txjax.experiment import build_dataset, data_file, load_workdir
from txjax.model.models import DecoderLM

CONTEXT_FACTORS = (2, 4)


def attention_entropy(workdir: str | Path) -> dict:
    """{'attention_entropy': mean H in nats} of the run's final parameters on its first valid batch."""
    run = load_workdir(workdir)
    batch = next(iter(build_dataset(run.config, run.tokenizer, "valid").eval_batches(run.config.train.batch_size)))
    model = DecoderLM(run.model.cfg, sow_weights=True)
    _, state = model.apply(
        {"params": run.params}, batch["inputs"], batch["positions"], batch["segment_ids"], mutable=["intermediates"]
    )
    weights_BxL = jnp.asarray(batch["weights"])
    entropies = []
    for p in jax.tree_util.tree_leaves(state["intermediates"]):  # [layers, B, H, Lq, Lk] (scanned) or [B, H, Lq, Lk]
        h = -jnp.sum(jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0), axis=-1)  # [..., B, H, Lq]
        w = jnp.broadcast_to(weights_BxL[:, None, :], h.shape)
        entropies.append((float((h * w).sum()), float(w.sum())))
    return {"attention_entropy": sum(e for e, _ in entropies) / sum(n for _, n in entropies)}


def context_lengths(workdir: str | Path) -> dict:
    """{'valid_loss_2x': ..., 'valid_loss_4x': ...} (NaN for a learned position table, which has no entries there)."""
    run = load_workdir(workdir)
    cfg, d = run.model.cfg, run.config.data
    out = {}
    for factor in CONTEXT_FACTORS:
        if cfg.positional == "learned":
            out[f"valid_loss_{factor}x"] = float("nan")
            continue
        model = DecoderLM(dataclasses.replace(cfg, max_len=cfg.max_len * factor))
        data = TextLMDataset(data_file(run.config, "valid"), run.tokenizer, d.seq_len * factor, "valid", d.val_fraction)
        metrics = evaluate(make_eval_step(model), run.params, eval_batches(data, run.config.train.batch_size))
        out[f"valid_loss_{factor}x"] = metrics["loss"]
    return out


def on_test_split(workdir: str | Path) -> dict:
    """{'test_loss': ..., 'test_bleu': ..., ...}: the numbers of split_metrics on the test split."""
    run = load_workdir(workdir)
    metrics = split_metrics(run, build_dataset(run.config, run.tokenizer, "test"))
    write_metrics(workdir, "test", {"split": "test", "step": run.step, **metrics})
    return {f"test_{k}": v for k, v in metrics.items() if isinstance(v, float)}


PROBES = {"attention_entropy": attention_entropy, "context_lengths": context_lengths, "test_split": on_test_split}


def run_probes(names, workdir: str | Path) -> dict:
    """The metrics of the named probes, one dict."""
    unknown = [n for n in names if n not in PROBES]
    if unknown:
        raise ValueError(f"unknown probe(s) {', '.join(unknown)}; known: {', '.join(PROBES)}")
    return {k: v for name in names for k, v in PROBES[name](workdir).items()}
