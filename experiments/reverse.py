"""The default experiment (`python run.py train`): a decoder-only LM learns to reverse strings of 1-8 digits.

Sequence: BOS d1..dn '=' dn..d1 EOS, loss on the answer only; no download, a few minutes on a laptop CPU; the final
eval reports exact match on 512 held-out strings: prompts that training never draws (txjax.data.synthetic: mostly
the longer strings, since few of the short ones can be held out).
"""

from txjax.config import base_config


def get_config():
    config = base_config()
    config.family = "decoder_lm"
    config.data.update(kind="synthetic", task="reverse", max_digits=8)
    config.model.update(num_layers=2, num_heads=4, d_model=128, d_ff=512, dropout=0.0)
    config.train.update(steps=600, batch_size=64, learning_rate=1e-3, warmup_steps=50)
    config.train.update(log_every=50, eval_every=200, checkpoint_every=200)
    return config
