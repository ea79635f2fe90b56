"""Attention scaling: scores q.k scaled by 1/sqrt(d_k) (Vaswani et al. 2017, eq. 1), not at all, or by 1/d_k.

Claim under test: unscaled scores grow with d_k and make the softmax spiky (low entropy). Reported: valid loss and
the mean entropy of the attention distributions on the first valid batch (txjax.evaluate.probes.attention_entropy).
shakespeare_char shape with 1000 instead of 2000 steps (CPU time), 3 seeds.
"""

from experiments.ablations import baseline


def get_sweep():
    return {
        "experiment": "experiments/shakespeare_char.py",
        "fixed": baseline.shakespeare_char(1000),
        "grid": {"model.attention_scale": ["sqrt", "none", "linear"]},
        "seeds": [0, 1, 2],
        "metrics": ["valid_loss", "attention_entropy"],
        "probes": ["attention_entropy"],
    }
