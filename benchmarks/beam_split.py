"""Decoding a whole split with beam search, the translation model's size: txjax against transformers' Marian
`generate(num_beams=4)`, sentences/s at each side's batch sizes, in one run (issue 19.2).

    python benchmarks/beam_split.py [--batches=8,32,64] [--new_tokens=48] [--beam_size=4] [--repeats=3]

- The sources: the test split of ../shared/data/bible tokenized with the 8,000-piece SentencePiece model of
  `benchmarks/train.py --shape=marian_small` (trained into runs/benchmarks/marian_small on first use), each with
  its EOS as in training; the marian_small shape (d_model 256, 3 + 3 layers, 4 heads, FFN 1024, shared and tied
  embeddings), random weights on both sides (each side's own initialisation, seed 0), float32 on both sides.
- Every hypothesis runs exactly --new_tokens steps (txjax: no eos_id; transformers: min_new_tokens =
  max_new_tokens), so both sides do the same work whatever the random weights prefer; 48 is about the length of a
  Spanish verse in these pieces.
- txjax: `txjax.decode.decode_all` (sorted by length, fixed-shape batches, one compilation per batch size);
  transformers: the sources sorted by length too, each batch padded to its longest with its attention mask.
- sentences/s = split size / the median wall time of --repeats passes over the whole split after one warm-up pass,
  the two sides' passes interleaved (common.time_calls); the best batch size of each side is the comparison.
Needs the `interop` extra. Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import functools
import json

import common
import jax
import numpy as np
import torch
from peer_hf import marian_config
from train import build_config
from transformers import MarianMTModel

from txjax import config as config_lib
from txjax.decode import decode_all, pad_batch
from txjax.experiment import build_dataset, build_model, build_tokenizer
from txjax.families import init_params


def test_sources(config) -> tuple[list[list[int]], object]:
    """The test split's source ids (each ending with EOS) and the tokenizer."""
    with config_lib.user_errors():
        tokenizer = build_tokenizer(config, config_lib.REPO / "runs" / "benchmarks" / "marian_small")
        return [list(src) for src in build_dataset(config, tokenizer, "test").sources], tokenizer


def transformers_pass(hf, sources: list[list[int]], batch: int, n: int, beams: int, pad: int):
    """One pass over the split in batches sorted by length, each padded to its longest."""
    ordered = sorted(sources, key=len)
    batches = []
    for start in range(0, len(ordered), batch):
        ids_BxS, lengths_B = pad_batch(ordered[start : start + batch], pad)
        mask_BxS = np.arange(ids_BxS.shape[1]) < lengths_B[:, None]
        batches.append((torch.from_numpy(ids_BxS).long(), torch.from_numpy(mask_BxS).long()))
    kwargs = dict(num_beams=beams, max_new_tokens=n, min_new_tokens=n, do_sample=False, early_stopping=False)

    def call():
        with torch.no_grad():
            return [hf.generate(ids, attention_mask=mask, **kwargs) for ids, mask in batches]

    return call


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="8,32,64")
    parser.add_argument("--new_tokens", type=int, default=48)
    parser.add_argument("--beam_size", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    common.warn_if_loaded()
    config = build_config("marian_small", ["--config.model.dropout=0.0", "--config.model.dtype=float32"])
    sources, tokenizer = test_sources(config)
    model = build_model(config)
    params = init_params(model, jax.random.key(0))
    torch.manual_seed(0)
    hf = MarianMTModel(marian_config(tokenizer.pad_id, tokenizer.eos_id, tokenizer.vocab_size, 0.0)).eval()
    n, beams = args.new_tokens, args.beam_size
    strategy = dict(method="beam", beam_size=beams, max_new_tokens=n)
    calls, rows = {}, []
    for batch in map(int, args.batches.split(",")):
        ours = functools.partial(
            decode_all,
            model,
            params,
            sources,
            batch_size=batch,
            bos_id=tokenizer.bos_id,
            pad_id=tokenizer.pad_id,
            **strategy,
        )
        calls[f"txjax batch {batch}"] = lambda ours=ours: ours().scores
        calls[f"transformers batch {batch}"] = transformers_pass(hf, sources, batch, n, beams, tokenizer.pad_id)
    timed = common.time_calls(calls, calls=args.repeats, warmup=1, rounds=args.repeats)
    for name, stats in timed.items():
        side, _, batch = name.split()
        rows.append({"side": side, "batch": int(batch), "sentences_per_s": len(sources) / (stats["median_ms"] / 1e3)})
    print(common.table(rows))
    best = {s: max(r["sentences_per_s"] for r in rows if r["side"] == s) for s in ("txjax", "transformers")}
    result = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "sentences": len(sources),
        "new_tokens": n,
        "beam_size": beams,
        "rows": rows,
        "best": best,
        "ratio_best": best["txjax"] / best["transformers"],
    }
    print(f"wrote {common.save('beam_split', result)}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
