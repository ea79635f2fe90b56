"""Optimizer settings for shakespeare_char at its full shape and budget (4 layers, 4 heads, d_model 128, context
64, batch 12, 2000 steps): peak learning rate x warmup x AdamW beta2, one seed per setting (issue 5.6: choose
defaults that reach valid loss <= 1.80; nanoGPT's recipe reaches 1.8857 here). All settings are optimizer scalars,
so the runs train together in vmapped programs.
"""


def get_sweep():
    return {
        "experiment": "experiments/shakespeare_char.py",
        "grid": {"train.learning_rate": [1e-3, 2e-3, 4e-3], "train.warmup_steps": [20, 100],
                 "train.b2": [0.95, 0.99]},
        "seeds": [0],
    }
