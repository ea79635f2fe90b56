"""The modded-nanogpt model options one at a time on the shakespeare_char baseline (issue 20.5): QK-norm (RMSNorm of
q and k per head before the scores, Dehghani et al. 2023), logit soft-capping at 30 (c tanh(z / c), Gemma 2),
ReLU^2 (So et al. 2021, modded-nanogpt), z-loss 1e-4 on log Z (PaLM), against the baseline with none of them.

The shakespeare_char target shape and length (2000 steps), 3 seeds: every option is part of the compiled program,
so each setting's 3 seeds train together in one vmapped program (5 programs).
"""

from experiments.ablations import baseline


def get_sweep():
    return {
        "experiment": "experiments/shakespeare_char.py",
        "fixed": baseline.shakespeare_char(2000),
        "zip": {
            "model.qk_norm": [False, True, False, False, False],
            "model.logit_softcap": [0.0, 0.0, 30.0, 0.0, 0.0],
            "model.activation": ["relu", "relu", "relu", "relu2", "relu"],
            "train.z_loss": [0.0, 0.0, 0.0, 0.0, 1e-4],
        },
        "seeds": [0, 1, 2],
    }
