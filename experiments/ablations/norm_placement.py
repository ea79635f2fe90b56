"""LayerNorm placement: pre-LN (x + f(LN(x)), GPT-2) versus post-LN (LN(x + f(x)), Vaswani et al. 2017), each with
the default 100-step learning-rate warmup and without warmup (Xiong et al. 2020: post-LN needs the warmup).

shakespeare_char shape with 500 instead of 2000 steps (CPU time), 3 seeds. The warmup axis is an optimizer
scalar, so each placement's 6 runs train together in one vmapped program.
"""

from experiments.ablations import baseline


def get_sweep():
    return {
        "experiment": "experiments/shakespeare_char.py",
        "fixed": baseline.shakespeare_char(500),
        "grid": {"model.norm_placement": ["pre", "post"], "train.warmup_steps": [100, 0]},
        "seeds": [0, 1, 2],
    }
