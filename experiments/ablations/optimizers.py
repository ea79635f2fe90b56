"""The optimizers of train.optimizer at the shakespeare_char target shape and length (2000 steps, issue 20.5), each
at three peak learning rates around its usual range: AdamW (the baseline's, lr 1e-3), Lion (Chen et al. 2023: a
sign update, so 3-10x smaller rates), Adafactor (factored second moments), Muon (orthogonalized momentum on the
weight matrices, AdamW on embeddings, one learning rate for both as optax.contrib.muon has it) and schedule-free AdamW
(evaluated at its averaged point). The cosine schedule, warmup and weight decay of the baseline, one seed.

The learning rate is an injected scalar, so each optimizer's three runs train together in one vmapped program
(5 programs).
"""

from experiments.ablations import baseline

RATES = {
    "adamw": [5e-4, 1e-3, 2e-3],
    "lion": [1e-4, 3e-4, 1e-3],
    "adafactor": [1e-3, 3e-3, 1e-2],
    "muon": [2.5e-3, 5e-3, 1e-2],
    "schedule_free_adamw": [1e-3, 2e-3, 4e-3],
}


def get_sweep():
    return {
        "experiment": "experiments/shakespeare_char.py",
        "fixed": baseline.shakespeare_char(2000),
        "zip": {
            "train.optimizer": [name for name, rates in RATES.items() for _ in rates],
            "train.learning_rate": [lr for rates in RATES.values() for lr in rates],
        },
        "seeds": [0],
    }
