"""An encoder-decoder learns multi-digit addition: source "a+b" (1-4 digits each), target the digits of a + b.

The algorithmic-task experiment of the encoder-decoder family (reverse.py is the decoder-only one). The answer is
written most significant digit first, so the decoder must look ahead over the carries through cross-attention.
"""

from txjax.config import base_config


def get_config():
    config = base_config()
    config.family = "encoder_decoder"
    config.data.update(kind="synthetic", task="add", min_digits=1, max_digits=4)
    config.model.update(num_layers=2, num_encoder_layers=2, num_heads=4, d_model=128, d_ff=512)
    config.model.update(dropout=0.0, positional="learned")
    config.train.update(steps=2000, batch_size=64, learning_rate=1e-3, warmup_steps=100)
    config.train.update(log_every=100, eval_every=500, checkpoint_every=500)
    return config
