"""Long context: a decoder-only LM retrieves a 2-digit passkey hidden anywhere in 8,192 symbols of random digits.

Sequence: BOS context '=' passkey EOS, loss on the answer only (txjax.data.synthetic's passkey task: the context is
random digits with '+' then the passkey inserted at a uniformly random position, so the answer may lie anywhere up to
the whole context back). Blockwise attention (txjax/model/blockwise.py) holds no n x n score matrix; RoPE carries
position, so the weights a short context trains apply at any length. The circuit (find '+', copy the digits after it) is
learnt where a random glance finds the '+' often, at context 16 (a run from there straight at 512 did not find it
again in 80 steps), so a curriculum stretches the context, each run from the last one's weights (train.init_from):
    python run.py train --config=experiments/passkey.py --workdir=C16 --config.data.min_digits=16
        --config.data.max_digits=16 --config.train.steps=500 --config.train.batch_size=64
        --config.train.learning_rate=3e-3 --config.train.warmup_steps=50
    python run.py train --config=experiments/passkey.py --workdir=C64 --config.train.init_from=C16
        --config.data.min_digits=64 --config.data.max_digits=64 --config.train.steps=150 --config.train.batch_size=32
    (the same at 256 from C64: 100 steps of 16 contexts; 1,024 from C256: 60 of 8; then doubling, which costs the
    circuit less than quadrupling: 2,048 from C1024: 60 of 8; 4,096 from C2048: 40 of 8; 8,192 from C4096: 60 of 4
    at learning_rate 1e-3; a run straight from 1,024 to 8,192 stayed at chance for its 21 steps)
    python run.py train --config=experiments/passkey.py --workdir=C8192B --config.train.init_from=C8192
    python run.py eval --workdir=C8192B --split=test
This file's defaults are the last run's: 40 more steps of 8 contexts of 8,192 at learning_rate 5e-4.
The final evals report exact match of the passkey on held-out contexts (docs/long_context.md, "An experiment").
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
    config.train.update(steps=40, batch_size=8, learning_rate=5e-4, warmup_steps=5, weight_decay=0.0, max_minutes=30)
    config.train.update(log_every=5, eval_every=0, checkpoint_every=10, eval_batches=2)
    config.decode.prefill_chunk = 512  # the eval's greedy decoding reads the context 512 tokens a call (bounded memory)
    return config
