"""Number of attention heads at fixed d_model = 128: 1, 2, 4, 8 heads of d_k = 128, 64, 32, 16 (the same
parameter count and FLOPs for the projections).

shakespeare_char shape with 500 instead of 2000 steps (CPU time), 3 seeds.
"""

from experiments.ablations import baseline


def get_sweep():
    return {
        "experiment": "experiments/shakespeare_char.py",
        "fixed": baseline.shakespeare_char(500),
        "grid": {"model.num_heads": [1, 2, 4, 8]},
        "seeds": [0, 1, 2],
    }
