"""Attention maps: the probabilities softmax(mask(q k^T * scale)) that the model's own attention computed.

A model built with sow_weights=True sows each layer's weights [B, H, Lq, Lk] into the 'intermediates' collection
(`MultiHeadAttention.attend`); `capture_attention` collects them per attention kind as [layers, H, Lq, Lk] for one
example, and `plot_attention` draws a grid of heatmaps (rows = queries, columns = keys, token labels on the axes):
one panel per head of one layer, or one per layer with its heads averaged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from txjax.decode import check_inputs, generate  # noqa: E402
from txjax.families import family_of  # noqa: E402
from txjax.model.models import stack_layers  # noqa: E402


def capture_attention(model, params, *inputs, method=None) -> dict[str, np.ndarray]:
    """Runs `model` (sow_weights=True) on one example; {'<stack>/<kind>': float32 [layers, H, Lq, Lk]}.

    Keys: 'decoder/self_attention' (DecoderLM, prefix LM); 'encoder/self_attention', 'decoder/self_attention' and
    'decoder/cross_attention' (EncoderDecoder). inputs: the model's positional arguments, each with batch 1.
    """
    if not getattr(model, "sow_weights", False):
        raise ValueError("capture_attention needs a model built with sow_weights=True")
    _, state = model.apply({"params": params}, *inputs, mutable=["intermediates"], method=method)
    stacks = stack_layers(state["intermediates"])  # looped layers_i -> one leading layer axis
    return {
        f"{stack}/{kind}": np.asarray(leaf["attention_weights"][0], np.float32)[:, 0]
        for stack, tree in stacks.items()
        for kind, leaf in tree["layers"].items()
    }


def token_labels(tokenizer, ids: Sequence[int]) -> list[str]:
    """One printable label per id: its text with whitespace made visible; special ids by name."""
    names = {tokenizer.pad_id: "<pad>", tokenizer.bos_id: "<bos>", tokenizer.eos_id: "<eos>"}
    labels = []
    for i in ids:
        text = names.get(i) or tokenizer.decode([i])
        text = text.replace("\n", "\\n").replace("\t", "\\t").replace(" ", "\u2423").replace("$", r"\$")
        labels.append(text or repr(i))
    return labels


def select_panels(weights_NxHxLxS: np.ndarray, layer: int | None, head: int | None):
    """[(title, [Lq, Lk])]: every head of `layer`, one head of it, or per layer `head` or the mean over heads."""
    num_layers, num_heads = weights_NxHxLxS.shape[:2]
    for name, value, limit in (("layer", layer, num_layers), ("head", head, num_heads)):
        if value is not None and not 0 <= value < limit:
            raise ValueError(f"--{name}={value} is out of range: the model has {limit} {name}s (0..{limit - 1})")
    if layer is not None:
        heads = range(num_heads) if head is None else [head]
        return [(f"layer {layer} head {h}", weights_NxHxLxS[layer, h]) for h in heads]
    if head is not None:
        return [(f"layer {i} head {head}", weights_NxHxLxS[i, head]) for i in range(num_layers)]
    return [(f"layer {i} (mean of {num_heads} heads)", weights_NxHxLxS[i].mean(0)) for i in range(num_layers)]


def plot_attention(panels, query_labels: Sequence[str], key_labels: Sequence[str], path, title: str = "") -> Path:
    """Heatmap grid of [(title, [Lq, Lk])] (rows = queries, columns = keys) written to `path` as a PNG."""
    n = len(panels)
    cols = math.ceil(math.sqrt(n))
    rows = math.ceil(n / cols)
    lq, lk = len(query_labels), len(key_labels)
    cell = min(0.3, 10.0 / max(lq, lk))  # inches per token: labels readable, figures bounded
    fontsize = max(4.0, min(9.0, 0.6 * 72 * cell))  # a label takes 60% of its cell's height (72 points an inch)
    norm = matplotlib.colors.PowerNorm(0.5, vmin=0.0, vmax=1.0)  # sqrt colour scale: weak weights stay visible
    fig, axes = plt.subplots(
        rows, cols, figsize=(cols * (lk * cell + 1.2), rows * (lq * cell + 1.2)), squeeze=False, constrained_layout=True
    )
    for ax, (name, w_LxS) in zip(axes.flat, panels):
        im = ax.imshow(w_LxS, cmap="viridis", norm=norm, interpolation="nearest", aspect="auto")
        ax.set_title(name, fontsize=10)
        ax.set_xticks(range(lk), key_labels, rotation=90, fontsize=fontsize)
        ax.set_yticks(range(lq), query_labels, fontsize=fontsize)
        ax.set_xlabel("keys", fontsize=fontsize)
        ax.set_ylabel("queries", fontsize=fontsize)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.colorbar(im, ax=axes, shrink=0.6, label="attention weight (sqrt scale)")
    if title:
        fig.suptitle(title)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def attention_maps(
    model,
    params,
    tokenizer,
    ids: Sequence[int],
    out,
    *,
    target_ids: Sequence[int] | None = None,
    layer: int | None = None,
    head: int | None = None,
) -> list[Path]:
    """PNGs of every attention kind for one example, as its family lays them out (Family.attention_example): a
    DecoderLM over `ids` -> `out`; an EncoderDecoder over source `ids` and decoder inputs `target_ids` -> out with
    -encoder, -decoder and -cross before the suffix; a prefix LM over [ids ; target_ids] -> `out`."""
    model = model.clone(sow_weights=True)
    inputs, maps = family_of(model).attention_example(list(ids), list(target_ids) if target_ids else None)
    weights = capture_attention(model, params, *inputs)
    labels = {"source": token_labels(tokenizer, ids), "target": token_labels(tokenizer, target_ids or [])}
    labels["row"] = labels["source"] + labels["target"]
    out = Path(out)
    return [
        plot_attention(
            select_panels(weights[key], layer, head),
            labels[queries],
            labels[keys],
            out.with_stem(out.stem + suffix),
            title=key.replace("/", " ").replace("_", "-"),
        )
        for key, (suffix, queries, keys) in maps.items()
    ]


def attention_inputs(run, text: str, target: str | None) -> tuple[list[int], list[int] | None]:
    """(ids, target ids) of `attention_maps` for a loaded run: `text` as the family reads it (Family.read_text: an
    LM's text alone, an encoder-decoder's source + EOS as in training) and the decoder inputs beside it
    (Family.attention_target: none for an LM; BOS + the given target, else BOS + the greedy translation of at most
    max_len - 1 tokens, so that it fits the decoder's context)."""
    tok, cfg = run.tokenizer, run.model.cfg
    family = family_of(run.model)
    ids, _ = family.read_text(tok, text)
    check_inputs([ids], cfg.vocab_size, cfg.max_len, "text")

    def target_ids() -> list[int]:
        if target is not None:
            return tok.encode(target)
        new = min(run.config.decode.max_new_tokens, cfg.max_len - 1)
        return generate(
            run.model, run.params, [ids], bos_id=tok.bos_id, pad_id=tok.pad_id, eos_id=tok.eos_id, max_new_tokens=new
        ).ids[0]

    tgt = family.attention_target(tok.bos_id, target_ids)
    if tgt is not None:
        check_inputs([tgt], cfg.vocab_size, cfg.max_len, "target")
    return ids, tgt
