"""LM head tied to the token embedding (logits = x E^T) versus a separate [d_model, vocab] matrix (+8,320
parameters at vocab 65).

shakespeare_char shape with 500 instead of 2000 steps (CPU time), 3 seeds.
"""

from experiments.ablations import baseline


def get_sweep():
    return {
        "experiment": "experiments/shakespeare_char.py",
        "fixed": baseline.shakespeare_char(500),
        "grid": {"model.tie_embeddings": [True, False]},
        "seeds": [0, 1, 2],
    }
