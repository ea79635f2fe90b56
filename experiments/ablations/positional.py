"""Positional encoding: none, sinusoidal, learned, RoPE, ALiBi; valid loss at the training context (64) and at
2x and 4x it (txjax.probes.context_lengths; not defined for the learned table, which has 64 entries).

shakespeare_char shape with 500 instead of 2000 steps (CPU time), 3 seeds.
"""


def get_sweep():
    return {
        "experiment": "experiments/shakespeare_char.py",
        "fixed": {"train.steps": 500},
        "grid": {"model.positional": ["none", "sinusoidal", "learned", "rope", "alibi"]},
        "seeds": [0, 1, 2],
        "metrics": ["valid_loss", "valid_loss_2x", "valid_loss_4x"],
        "probes": ["context_lengths"],
    }
