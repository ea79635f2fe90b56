"""English -> Spanish translation of Bible verses with a Transformer encoder-decoder (Vaswani et al. 2017, scaled
down for a CPU): 3 + 3 layers, d_model 256, 4 heads, FFN 1024 with ReLU^2 (max(0, x)^2; modded-nanogpt), RoPE
on self-attention (the paper's sinusoidal positions: --config.model.positional=sinusoidal), label smoothing 0.1,
shared and tied embeddings scaled by sqrt(d_model) at the input (the size of issue 8's MarianMTModel peer); pre-LN
(the paper's post-LN: --config.model.norm_placement=post).

Tokenizer: one SentencePiece unigram model of 8000 pieces shared by both languages, trained on both sides of the
training file on the first run and kept in the workdir's tokenizer/. Pairs are packed into rows of 128 tokens, 8 rows
per step. Budget: 20 minutes of training time (evals not counted), used whole on any machine: a WSD schedule sized
by the budget (train.decay_start="budget", txjax.training.budget) holds the peak lr until 16 minutes have passed, then
decays linearly to lr/10 over the steps the last 4 minutes hold at the measured step rate, and the run ends there
(train.steps = 10,000 is only a cap; the cosine schedule of earlier versions was sized at 2,100 steps for one
machine's speed). An eval every 5 minutes logs valid loss and greedy BLEU/chrF. Test BLEU with beam 4:
`python run.py eval --workdir=DIR --split=test` (experiments/results/bible_en_es/: 3,277 steps in the 20 minutes;
test BLEU 22.93, chrF 43.66; run again, variants/checkpoints100: 3,357 steps, 23.24, chrF 43.79; with sinusoidal
positions 22.72, with GELU too 22.08, 16 rows per step 21.73, the cosine schedule's runs 19.79 and 20.32).
Averaging the last 8 checkpoints, saved every 100 steps over the decay (--config.train.checkpoint_every=100
--config.train.keep_checkpoints=8, then run.py eval --average=8): test BLEU 23.68 against 23.24 in one run, valid
BLEU +0.55 but valid chrF -0.56, so not the default.
Chosen by evidence (experiments/ablations/bible_budget.py, equal steps): no dropout, since 20 minutes are a few
passes over the data, and peak lr 1e-3 (2e-3 trailed); layers as a Python loop, faster per step than nn.scan at
this depth (benchmarks/train.py --scan_layers). 20-minute variants (docs/experiments.md, bible_variants;
experiments/results/bible_en_es/variants/): RoPE rather than sinusoidal positions (the positional sweep's best
on shakespeare_char; here valid loss 2.728 against 2.838, greedy valid BLEU 20.98 against 19.42, test BLEU +0.21,
chrF -0.22), ReLU^2 rather than GELU (the model_options sweep's best on shakespeare_char; here valid loss 2.838
against 2.867 in 3,344 steps against 3,808, test BLEU +0.64), 8 rows per step rather than 16 (valid loss -0.096,
test BLEU +0.35: 2.1x the updates at 0.56x the time per step), 32 rows with warmup 100 (-3.4 BLEU against 16),
decaying to zero over the last 40% (-1.0 against 16), 4,000 pieces (-1.3 against 16: shorter hypotheses), decaying
over the last 30% (valid loss equal, test BLEU -0.39). Stopped when they trailed at their first eval or before: 4
rows per step (valid loss 4.42 against 8 rows' 4.00 at 5 minutes), peak lr 7e-4 and 1.5e-3 (train loss above
1e-3's at every logged step, to 1,800 and 1,200), RoPE without the embedding scaling (valid loss 4.30 at 5 minutes
against sinusoidal's 4.13 and 4.03 with it), Muon at lr 3e-3 (train loss lower at equal steps, 4.08 against 4.34 at
step 400, but 1.8x the step time: Newton-Schulz on every 256-wide matrix costs about what the 1,024-token step does;
valid loss 4.43 at 5 minutes against 4.03). Beam 4 at length penalty 0.6: 0.3 and 1.0 read within 0.5 BLEU on
valid (variants/batch16/length_penalty/).
"""

from txjax.config import base_config


def get_config():
    config = base_config()
    config.family = "encoder_decoder"
    bible = "../shared/data/bible/{}.en-es.tsv"
    config.data.update(kind="parallel", path=bible.format("train"))
    config.data.update(valid_path=bible.format("valid"), test_path=bible.format("test"))
    config.data.update(tokenizer="sentencepiece", vocab_size=8000)  # one model for both languages
    config.data.update(max_src_len=128, max_tgt_len=128, pack=True)  # pairs packed into rows of 128
    config.model.update(num_layers=3, num_encoder_layers=3, num_heads=4, d_model=256, d_ff=1024)
    config.model.update(dropout=0.0, positional="rope", embed_scale=True, activation="relu2")
    config.model.update(share_embeddings=True, tie_embeddings=True)
    config.model.update(dtype="bfloat16", scan_layers=False)
    config.train.update(steps=10_000, batch_size=8, learning_rate=1e-3, warmup_steps=200, label_smoothing=0.1)
    config.train.update(max_minutes=20.0, eval_every_minutes=5.0, eval_generation=True)  # the budget, timed evals
    config.train.update(schedule="wsd", decay_start="budget", decay_fraction=0.2)  # decay over its last 4 minutes
    config.train.update(log_every=50, eval_every=0, eval_batches=0, checkpoint_every=250)
    config.decode.update(method="beam", max_new_tokens=128, beam_size=4, length_penalty=0.6)  # what 128 positions hold
    return config
