"""Long context: a decoder-only LM retrieves a 2-digit passkey hidden anywhere in 8,192 symbols of random digits.

Sequence: BOS context '=' passkey EOS, loss on the answer only (txjax.data.synthetic's passkey task: the context is
random digits with '+' then the passkey inserted at a uniformly random position, so the answer may lie anywhere up to
the whole context back). Blockwise attention (txjax/blockwise.py) holds no n x n score matrix; RoPE carries position,
so the weights a short context trains apply at any length. A curriculum in two runs: this config at context 512
(`--config.data.min_digits=512 --config.data.max_digits=512`), then at 8,192 from its weights
(`--config.train.init_from=THAT_WORKDIR`). The final eval reports exact match of the passkey on held-out contexts.
"""

from txjax.config import base_config
from txjax.data.synthetic import PASSKEY_DIGITS


def get_config():
    config = base_config()
    config.family = "decoder_lm"
    config.data.update(kind="synthetic", task="passkey", min_digits=8192, max_digits=8192, eval_size=128)
    config.model.update(num_layers=2, num_heads=4, d_model=64, d_ff=256, dropout=0.0, positional="rope")
    config.model.max_len = (
        8192 + PASSKEY_DIGITS + 2
    )  # the 8,192 run's sequences, also set by the short run it starts from
    config.model.update(attention_impl="blockwise", attention_block_q=512, attention_block_kv=512)
    config.train.update(steps=300, batch_size=32, learning_rate=3e-3, warmup_steps=30)
    config.train.update(log_every=25, eval_every=100, checkpoint_every=100, eval_batches=2)
    return config
