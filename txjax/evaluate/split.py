"""Evaluation over a whole split: one jitted eval_step per batch, sums added up in float64, one division at the end.

    loss = sum_t w_t CE_t / sum_t w_t,   perplexity = exp(loss),   token_accuracy = sum_t w_t [argmax = y_t] / sum_t w_t
By position (`by_position` = W > 0): the same loss over the tokens whose place in their row (the window's position,
0-based) lies in [iW, (i+1)W), per bucket i: how the loss moves along the context (e.g. past the training length).
A model with multi-token prediction adds each depth's loss (mtp_loss_1, ...: txjax.model.mtp).
A mixture-of-experts model adds its routing metrics (txjax.model.moe.eval_metrics: expert load, tokens dropped, aux
losses).
The datasets pad the last batch with weight-0 rows, so every token counts exactly once, whatever the batch size.
exact_match (synthetic tasks) is the fraction of examples whose every weighted target is the teacher-forced argmax.
By induction over the answer this is the same event as "greedy decoding writes the answer, then EOS" (up to argmax
ties and the float differences of the cached decode path); `txjax.decode` measures it by generation.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import shlex
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import sacrebleu
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from txjax import decode
from txjax.data import KINDS, prefetch
from txjax.families import family_of
from txjax.families.objective import forward, hits, mtp_metrics, mtp_sums, params_shardings, token_sums
from txjax.model import moe, ring_attention
from txjax.ops import provenance
from txjax.parallel import distributed
from txjax.parallel.sharding import batch_sharding, global_batch, on_mesh, process_rows


def make_eval_step(model, mesh: Mesh | None = None, by_position: bool = False):
    """jit(params, batch) -> per-batch sums: loss, correct, weight, exact (examples all right), examples, and with
    `by_position` position_loss and position_weight [L] (per column of the rows); on `mesh` (default: the first
    device) the params laid out by their logical axes, the batch's rows split over the data and fsdp axes and its
    length over sequence, the sums replicated; traced under the mesh (sharding.on_mesh)."""
    mesh = mesh or distributed.first_device_mesh()

    def eval_step(params, batch):
        logits_BxLxV, targets_BxL, weights_BxL, stats, depths = forward(model, params, batch)
        sums = token_sums(logits_BxLxV, targets_BxL, weights_BxL) | moe.eval_sums(stats)
        sums |= {k: v for k, v in mtp_sums(depths, 0.0).items() if k != "mtp_objective"}
        right_BxL = hits(logits_BxLxV, targets_BxL) | (weights_BxL == 0)
        real_B = weights_BxL.sum(-1) > 0  # padding rows hold no example
        if by_position:
            sums |= position_sums(logits_BxLxV, targets_BxL, weights_BxL)
        return sums | {"exact": (right_BxL.all(-1) & real_B).sum(), "examples": real_B.sum()}

    return jax.jit(
        on_mesh(eval_step, mesh),
        in_shardings=(params_shardings(model, mesh), batch_sharding(mesh)),
        out_shardings=NamedSharding(mesh, P()),
    )


def position_sums(logits_BxLxV, targets_BxL, weights_BxL) -> dict:
    """The weighted cross-entropy and weight summed over the rows, per column [L] in the batch's own order (forward's
    zig-zag order under ring attention undone: the layout of the column indices says where each column went)."""
    ce_BxL = optax.softmax_cross_entropy_with_integer_labels(logits_BxLxV.astype(jnp.float32), targets_BxL)
    b, length = targets_BxL.shape
    columns_BxL = ring_attention.layout({"c": jnp.broadcast_to(jnp.arange(length), (b, length))})["c"]
    per_column = jnp.zeros(length, jnp.float32).at[columns_BxL]
    return {"position_loss": per_column.add(weights_BxL * ce_BxL), "position_weight": per_column.add(weights_BxL)}


def evaluate(eval_step, params, batches, exact_match: bool = False, by_position: int = 0) -> dict:
    """Metrics over `batches` (an iterable of eval batches; the steps are dispatched a few ahead and their sums added
    up in float64 as they finish, so memory does not grow with the number of batches). by_position = W > 0 (an eval
    step made with by_position): also "by_position", the loss per bucket of W positions (module docstring)."""
    total = {}  # float64 sums, arrays (an MoE's loads per expert) included

    def add(sums):
        for k, value in sums.items():
            total[k] = total.get(k, 0.0) + np.asarray(value, np.float64)

    in_flight, num_batches = distributed.InFlight(on_done=add), 0
    for batch in batches:
        in_flight.add(eval_step(params, batch))
        num_batches += 1
    in_flight.flush()
    loss = float(total["loss"] / max(total["weight"], 1.0))
    metrics = {
        "loss": loss,
        "perplexity": math.exp(min(loss, 700.0)),
        "token_accuracy": float(total["correct"] / max(total["weight"], 1.0)),
        "tokens": int(total["weight"]),
    }
    if exact_match:
        metrics |= {
            "exact_match": float(total["exact"] / max(total["examples"], 1.0)),
            "examples": int(total["examples"]),
        }
    if by_position:
        metrics["by_position"] = bucketed(total["position_loss"], total["position_weight"], by_position)
    if "mtp_loss" in total:
        metrics |= {k: float(v) for k, v in mtp_metrics(total["mtp_loss"], total["mtp_weight"]).items()}
    return metrics | moe.eval_metrics(total, num_batches)


def bucketed(loss_L, weight_L, width: int) -> dict:
    """Per-position sums [L] added up in buckets of `width` positions: each bucket's first position, loss (per
    weighted token) and tokens."""
    starts = list(range(0, len(loss_L), width))
    loss, weight = np.add.reduceat(loss_L, starts), np.add.reduceat(weight_L, starts)
    return {
        "from": starts,
        "loss": [float(s / w) if w else None for s, w in zip(loss, weight)],
        "tokens": [int(w) for w in weight],
    }


def eval_batches(dataset, batch_size: int, max_batches: int = 0, mesh: Mesh | None = None):
    """The split's eval batches, the first max_batches of them if > 0, as global_batches."""
    batches = dataset.eval_batches(batch_size)
    return global_batches(itertools.islice(batches, max_batches) if max_batches else batches, batch_size, mesh)


def global_batches(batches, batch_size: int, mesh: Mesh | None = None):
    """`batches` (of batch_size rows each) built ahead in a background thread, as global arrays on `mesh` (default:
    the first device) to which each process gives its rows."""
    mesh = mesh or distributed.first_device_mesh()
    rows = process_rows(mesh, batch_size)
    return prefetch(global_batch({k: x[rows] for k, x in batch.items()}, mesh) for batch in batches)


def split_metrics(run, dataset, mesh: Mesh | None = None, by_position: int = 0, **strategy) -> dict:
    """A loaded run's (txjax.experiment.TrainedRun) metrics over the whole `dataset` (one of its splits): the teacher-
    forced ones (evaluate) and its generated ones with its decode section, `strategy` overriding fields of it
    (generation_metrics): what `run.py eval --split=S` prints, and the sweep probe test_split."""
    step = make_eval_step(run.model, mesh, by_position=by_position > 0)
    batches = eval_batches(dataset, run.config.train.batch_size, mesh=mesh)
    exact_match = KINDS[run.config.data.kind].exact_match
    metrics = evaluate(step, run.params, batches, exact_match=exact_match, by_position=by_position)
    return metrics | generation_metrics(run.model, run.params, run.tokenizer, dataset, run.config.decode, **strategy)


def generation_metrics(model, params, tokenizer, dataset, decoding, batch_size: int = 64, **strategy) -> dict:
    """Metrics of `model`'s decoded outputs at `params`, the whole split in jitted batches (txjax.decode.decode_all),
    as the dataset's `generated_metric` names them (GENERATED; {} for none): a synthetic task's greedy exact match,
    a translation's BLEU and chrF."""
    metric = GENERATED.get(getattr(dataset, "generated_metric", None))
    return {} if metric is None else metric(model, params, tokenizer, dataset, decoding, batch_size, **strategy)


def generated_exact_match(model, params, tokenizer, dataset, decoding, batch_size: int, **strategy) -> dict:
    """Greedy exact match of a synthetic task (the answer, then EOS; of `strategy` only prefill_chunk applies)."""
    prompts, answers = dataset.eval_examples()  # BOS prompt '=' (LM), prompt EOS (seq2seq: decoder from BOS)
    # greedy, whatever the decode section's method; its prefill_chunk still holds: a long context is fed in
    # chunks, so prefill attends with chunk x cache scores, not context x context
    chunk = strategy.get("prefill_chunk", decoding.get("prefill_chunk", 0)) or None
    out = decode.decode_all(
        model,
        params,
        prompts,
        batch_size=batch_size,
        eos_id=tokenizer.eos_id,
        pad_id=tokenizer.pad_id,
        max_new_tokens=max(map(len, answers)) + 1,
        bos_id=tokenizer.bos_id,
        prefill_chunk=chunk,
    )
    right = [ids == answer and stopped for ids, answer, stopped in zip(out.ids, answers, out.stopped)]
    return {"generated_exact_match": float(np.mean(right))}


def translation_metrics(model, params, tokenizer, dataset, decoding, batch_size: int, **strategy) -> dict:
    """sacreBLEU BLEU and chrF of the strategy of `decoding` (a config's decode section, or a mapping of its fields;
    `strategy` overrides them, e.g. method="greedy") against the raw references, with sacreBLEU's signatures (also
    printed) and the strategy used; at most the new tokens the family fits in the model's context."""
    strategy = decode.strategy_from_config(decoding, tokenizer.eos_id, **strategy)
    room = family_of(model).max_new_tokens(model.cfg, max(map(len, dataset.sources)))
    strategy["max_new_tokens"] = min(strategy["max_new_tokens"], room)
    out = decode.decode_all(
        model,
        params,
        dataset.sources,
        batch_size=batch_size,
        pad_id=tokenizer.pad_id,
        bos_id=tokenizer.bos_id,
        **strategy,
    )
    hypotheses = [tokenizer.decode(ids) for ids in out.ids]
    references = [[target for _, target in dataset.raw_pairs()]]
    bleu, chrf = sacrebleu.metrics.BLEU(), sacrebleu.metrics.CHRF()
    bleu_score, chrf_score = bleu.corpus_score(hypotheses, references), chrf.corpus_score(hypotheses, references)
    print(bleu_score.format(signature=str(bleu.get_signature())))
    print(chrf_score.format(signature=str(chrf.get_signature())))
    return {
        "decode": {name: value for name, value in strategy.items() if name != "eos_id"},
        "bleu": bleu_score.score,
        "chrf": chrf_score.score,
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
    }


GENERATED = {"exact_match": generated_exact_match, "translation": translation_metrics}  # a dataset's generated_metric


def metrics_file(workdir: str | Path, split: str) -> Path:
    return Path(workdir) / f"eval_{split}.json"


def changed_name(split: str, changes: dict) -> str:
    """The name an eval in a changed model writes under (eval_<split>_<digest>.json): `split`, and a short digest of
    `changes` ({field: value}) when there are any, so that the training's eval_<split>.json, which reports read, stays
    as it was, and the same changes name the same file whatever the order of their flags."""
    if not changes:
        return split
    return f"{split}_{hashlib.sha256(json.dumps(changes, sort_keys=True).encode()).hexdigest()[:8]}"


def read_recorded(workdir: str | Path, split: str) -> dict:
    """What DIR/eval_<split>.json records ({} when there is none)."""
    path = metrics_file(workdir, split)
    return json.loads(path.read_text()) if path.is_file() else {}


def write_metrics(workdir: str | Path, split: str, metrics: dict) -> Path:
    """Writes DIR/eval_<split>.json: the metrics and, under "machine", where, when and by what command
    (txjax.ops.provenance)."""
    path = metrics_file(workdir, split)
    machine = provenance.machine(shlex.join(["python", *sys.argv]))
    path.write_text(json.dumps({**metrics, "machine": machine}, indent=1) + "\n")
    return path
