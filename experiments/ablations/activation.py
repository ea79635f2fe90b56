"""FFN activation at a matched parameter count: ReLU and GELU with d_ff = 512 (2 * 128 * 512 = 131,072 weights per
layer) versus SwiGLU with three matrices and d_ff = 341 = round(2/3 * 512) (3 * 128 * 341 = 130,944).

shakespeare_char shape with 500 instead of 2000 steps (CPU time), 3 seeds.
"""

from experiments.ablations import baseline


def get_sweep():
    return {
        "experiment": "experiments/shakespeare_char.py",
        "fixed": baseline.shakespeare_char(500),
        "zip": {"model.activation": ["relu", "gelu", "swiglu"], "model.d_ff": [512, 512, 341]},
        "seeds": [0, 1, 2],
    }
