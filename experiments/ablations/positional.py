"""Positional encoding: none, sinusoidal, learned, RoPE, ALiBi; valid loss at the training context (64) and at
2x and 4x it (txjax.evaluate.probes.context_lengths; not defined for the learned table, which has 64 entries).
Sinusoidal runs twice: added to the token embeddings as they are (std 0.02, so the +-1 sinusoids dominate them) and
with the embeddings scaled by sqrt(d_model) first, as Vaswani et al. (2017, sec. 3.4) do.
shakespeare_char shape with 500 instead of 2000 steps (CPU time), 3 seeds.
"""

from experiments.ablations import baseline


def get_sweep():
    return {
        "experiment": "experiments/shakespeare_char.py",
        "fixed": baseline.shakespeare_char(500),
        "zip": {
            "model.positional": ["none", "sinusoidal", "sinusoidal", "learned", "rope", "alibi"],
            "model.embed_scale": [False, False, True, False, False, False],
        },
        "seeds": [0, 1, 2],
        "metrics": ["valid_loss", "valid_loss_2x", "valid_loss_4x"],
        "probes": ["context_lengths"],
    }
