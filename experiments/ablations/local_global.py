"""Local against global attention at equal compute: windows of 64 and 128 tokens in three of every four layers
('LLLG', the fourth global) against every layer global, on the shakespeare_char baseline at context 256.

The context is 256, not the experiment's 64: a window only changes what a query sees once the context is longer than
the window, and at 256 a window of 64 hides three quarters of the keys from the last queries of a row (128: half).
Every setting trains the same model (the same parameters) on the same batches for the same steps: 3 rows of 256
tokens, the baseline's 768 tokens a step (12 rows of 64). The attention is blockwise in 64 x 64 blocks in all three
(txjax.model.blockwise), so a local layer skips the key blocks outside its window and the step times compare what the
window saves. 500 steps, 2 seeds (CPU time). The all-global runs are also the models of evals/rope_extension.py.
"""

from experiments.ablations import baseline


def get_sweep():
    attention = {"model.attention_impl": "blockwise", "model.attention_block_q": 64, "model.attention_block_kv": 64}
    return {
        "experiment": "experiments/shakespeare_char.py",
        "fixed": {**baseline.shakespeare_char(500), "data.seq_len": 256, "train.batch_size": 3, **attention},
        "zip": {"model.attention_window": [0, 64, 128], "model.window_pattern": ["", "LLLG", "LLLG"]},
        "seeds": [0, 1],
    }
