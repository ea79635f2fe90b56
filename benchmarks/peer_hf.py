"""The Hugging Face peers of issue 8, measured on this machine today, the way issue 8 describes them.

    python benchmarks/peer_hf.py [--what=train,decode] [--steps=20] [--repeats=3]

Needs the `interop` extra (torch CPU, transformers). The issue's figures were taken on a day this machine ran
faster (its matmul peak then: 250-400 float32 GFLOP/s; `benchmarks/peak.py` measures today's), so txjax's figures
are compared with these same-day ones as well as with the issue's.
- train: MarianMTModel from scratch (d_model 256, 3+3 layers, 4 heads, FFN 1024, dropout 0.1, shared and tied
  embeddings), the 8,000-piece SentencePiece vocabulary txjax trains on both sides of the Bible corpus
  (runs/benchmarks/marian_small, made by `benchmarks/train.py --shape=marian_small`), AdamW 5e-4, label smoothing
  0.1, batches of 32 random sentence pairs padded to their longest; target tokens/s = non-padding target tokens
  of the timed steps / their wall time (median of per-step rates after 3 warm-up steps).
- bleu (--what=bleu, --minutes=20): the same model and batches trained for that much training time with issue 8's
  schedule (AdamW 5e-4, 1,000 warmup steps then inverse square root), then test BLEU (sacreBLEU defaults) of
  greedy and beam-4 `generate`.
- decode: `generate(do_sample=False)` with its KV cache, batch 1, a 1-token prompt, exactly 256 new tokens, random
  weights: GPT-2 small and the shakespeare_char shape (4 layers, 4 heads, d_model 128, vocabulary 65).
Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import common
import numpy as np
import sacrebleu
import torch
from train import build_config
from transformers import GPT2Config, GPT2LMHeadModel, MarianConfig, MarianMTModel

from txjax import config as config_lib
from txjax.experiment import build_dataset, build_tokenizer

PEER_ISSUE = {
    "marian_target_tokens_per_s": 3017,
    "gpt2_small_tokens_per_s": 34.6,
    "shakespeare_char_tokens_per_s": 1063,
}


def marian_config(pad: int, eos: int, vocab: int, dropout: float) -> MarianConfig:
    """The peer's MarianConfig: d_model 256, 3 + 3 layers, 4 heads, FFN 1024, shared and tied embeddings."""
    return MarianConfig(
        vocab_size=vocab,
        d_model=256,
        encoder_layers=3,
        decoder_layers=3,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=1024,
        decoder_ffn_dim=1024,
        dropout=dropout,
        max_position_embeddings=512,
        pad_token_id=pad,
        eos_token_id=eos,
        decoder_start_token_id=pad,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
    )


def marian_setup():
    """(tokenizer, train pairs, test pairs, model, optimizer, loss function, batch builder) of the peer."""
    config = build_config("marian_small", [])
    with config_lib.user_errors():
        tokenizer = build_tokenizer(config, config_lib.REPO / "runs" / "benchmarks" / "marian_small")
        pairs = list(build_dataset(config, tokenizer, "train").raw_pairs())
        test = list(build_dataset(config, tokenizer, "test").raw_pairs())
    pad, eos, vocab = tokenizer.pad_id, tokenizer.eos_id, tokenizer.vocab_size
    model = MarianMTModel(marian_config(pad, eos, vocab, dropout=0.1))
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
    loss_fn = torch.nn.CrossEntropyLoss(ignore_index=-100, label_smoothing=0.1)

    def padded(seqs):
        out = torch.full((len(seqs), max(map(len, seqs))), pad, dtype=torch.long)
        for i, s in enumerate(seqs):
            out[i, : len(s)] = torch.tensor(s)
        return out

    def train_step(batch, scheduler=None) -> int:
        """One AdamW step on a batch of (source, target) texts; returns its non-padding target tokens."""
        src = padded([tokenizer.encode(s)[:127] + [eos] for s, _ in batch])
        tgt = padded([tokenizer.encode(t)[:127] + [eos] for _, t in batch])
        labels = tgt.masked_fill(tgt == pad, -100)
        logits = model(input_ids=src, attention_mask=(src != pad).long(), labels=labels).logits
        loss_fn(logits.reshape(-1, vocab), labels.reshape(-1)).backward()
        optimizer.step()
        optimizer.zero_grad()
        if scheduler is not None:
            scheduler.step()
        return int((labels != -100).sum())

    return tokenizer, pairs, test, model, optimizer, train_step, padded


def marian_throughput(steps: int) -> float:
    """Median target tokens/s of MarianMTModel training steps on random batches of 32 Bible verse pairs."""
    _, pairs, _, _, _, train_step, _ = marian_setup()
    rng = np.random.default_rng(0)
    rates = []
    for step in range(steps + 3):
        batch = [pairs[i] for i in rng.integers(0, len(pairs), 32)]
        began = time.perf_counter()
        tokens = train_step(batch)
        if step >= 3:
            rates.append(tokens / (time.perf_counter() - began))
    return statistics.median(rates)


def marian_bleu(minutes: float) -> dict:
    """Test BLEU (greedy, beam 4) after `minutes` of training time with issue 8's schedule."""
    tokenizer, pairs, test, model, optimizer, train_step, padded = marian_setup()
    schedule = lambda step: min((step + 1) / 1000, (1000 / (step + 1)) ** 0.5)  # x 5e-4: warmup, inverse sqrt
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    rng, trained, steps = np.random.default_rng(0), 0.0, 0
    while trained < 60 * minutes:
        order = rng.permutation(len(pairs))
        for start in range(0, len(order) - 31, 32):
            began = time.perf_counter()
            train_step([pairs[i] for i in order[start : start + 32]], scheduler)
            trained, steps = trained + time.perf_counter() - began, steps + 1
            if trained >= 60 * minutes:
                break
    model.eval()
    references = [[t for _, t in test]]
    result = {"minutes": minutes, "steps": steps}
    special = {tokenizer.pad_id, tokenizer.eos_id, tokenizer.bos_id}
    for name, beams in (("greedy", 1), ("beam4", 4)):
        hypotheses = []
        with torch.no_grad():
            for start in range(0, len(test), 32):
                src = padded([tokenizer.encode(s)[:127] + [tokenizer.eos_id] for s, _ in test[start : start + 32]])
                out = model.generate(
                    input_ids=src,
                    attention_mask=(src != tokenizer.pad_id).long(),
                    num_beams=beams,
                    do_sample=False,
                    max_new_tokens=160,
                )
                hypotheses += [tokenizer.decode([i for i in row.tolist() if i not in special]) for row in out]
        result[f"bleu_{name}"] = sacrebleu.corpus_bleu(hypotheses, references).score
        result[f"chrf_{name}"] = sacrebleu.corpus_chrf(hypotheses, references).score
    return result


def generate_throughput(config: GPT2Config, repeats: int, new_tokens: int = 256) -> float:
    """Median tokens/s of greedy cached generation of exactly `new_tokens` tokens, batch 1, random weights."""
    model = GPT2LMHeadModel(config).eval()
    prompt = torch.zeros((1, 1), dtype=torch.long)
    kwargs = dict(do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0)
    times = []
    with torch.no_grad():
        model.generate(prompt, **kwargs)  # warm-up
        for _ in range(repeats):
            began = time.perf_counter()
            model.generate(prompt, **kwargs)
            times.append(time.perf_counter() - began)
    return new_tokens / statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--what", default="train,decode", help="comma-separated: train, decode, bleu")
    parser.add_argument("--minutes", type=float, default=20.0, help="bleu: training minutes")
    parser.add_argument("--steps", type=int, default=20, help="timed Marian training steps")
    parser.add_argument("--repeats", type=int, default=3, help="timed generations per shape")
    args = parser.parse_args()
    common.warn_if_loaded()
    torch.manual_seed(0)
    result = {"torch": torch.__version__, "threads": torch.get_num_threads()}
    if "train" in args.what:
        result["marian_target_tokens_per_s"] = marian_throughput(args.steps)
    if "bleu" in args.what:
        result["marian_bleu"] = marian_bleu(args.minutes)
    if "decode" in args.what:
        result["shakespeare_char_tokens_per_s"] = generate_throughput(
            GPT2Config(
                vocab_size=65, n_positions=1024, n_embd=128, n_layer=4, n_head=4, bos_token_id=0, eos_token_id=0
            ),
            args.repeats,
        )
        result["gpt2_small_tokens_per_s"] = generate_throughput(GPT2Config(), args.repeats)
    rows = [{"figure": k, "today": v, "issue 8": PEER_ISSUE.get(k)} for k, v in result.items() if k in PEER_ISSUE]
    print(common.table(rows))
    print(f"wrote {common.save('peer_hf_' + args.what.replace(',', '_'), result)}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
