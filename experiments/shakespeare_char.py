"""A character-level GPT on tinyshakespeare in the shape of nanoGPT's CPU recipe, with defaults chosen by ablation.

Shape as nanoGPT's README runs it on a CPU: 4 layers, 4 heads, d_model 128, context 64, batch 12, 2000 steps
(warmup 100 then cosine to lr/10, weight decay 0.1, clip 1.0), no dropout. Vocabulary: the 65 characters of the
file; split: the first 90% trains, the last 10% is the valid split.
Changed from nanoGPT's recipe by the evidence (valid loss at step 2000 over the whole split): RoPE instead of
learned positions, ReLU instead of GELU and attention scores left unscaled (no 1/sqrt(d_k), d_k = 32 here), from
experiments/ablations/results/shakespeare_defaults/ (3 seeds); Muon at lr 5e-3 instead of AdamW at 1e-3 (b2 0.99,
kept for the norms and biases Muon leaves to Adam), from results/optimizers/ and results/schedules/: 1.581 +- 0.004
over 3 seeds against AdamW's 1.680 (nanoGPT's recipe: 1.8857), at ~2.2x AdamW's step time on a CPU (Newton-Schulz on
every matrix). nanoGPT's optimizer: --config.train.optimizer=adamw --config.train.learning_rate=1e-3.
Speed (benchmarks/train.py --shape=shakespeare_char): bfloat16 matmuls with float32 accumulation and a float32
residual stream, and the 4 layers as a Python loop (XLA fuses across them; nn.scan's stacked activations cost more
than its compile-time saving at this depth). On a CPU without AVX512_BF16 (or AMX), --config.model.dtype=float32 is
the faster choice.
"""

from txjax.config import base_config


def get_config():
    config = base_config()
    config.family = "decoder_lm"
    config.data.update(kind="text", path="../shared/data/tinyshakespeare/input.txt", tokenizer="char", seq_len=64)
    config.data.val_fraction = 0.1  # nanoGPT's split: the last 10% of the characters
    config.model.update(num_layers=4, num_heads=4, d_model=128, d_ff=512, dropout=0.0)  # nanoGPT's CPU shape
    config.model.update(positional="rope", activation="relu", attention_scale="none")  # the ablations' choices
    config.model.update(tie_embeddings=True, use_bias=False)
    config.model.update(dtype="bfloat16", scan_layers=False)  # speed: bf16 matmuls, a looped 4-layer stack
    config.train.update(steps=2000, batch_size=12, min_lr_ratio=0.1, warmup_steps=100)
    config.train.update(optimizer="muon", learning_rate=5e-3)  # the optimizers and schedules ablations' choice
    config.train.update(b2=0.99, weight_decay=0.1, grad_clip=1.0)  # nanoGPT's AdamW settings (Muon's Adam part)
    config.train.update(log_every=100, eval_every=250, eval_batches=20, checkpoint_every=500)
    return config
