"""The learning-rate schedules (issue 20.2) on the shakespeare_char baseline at its full shape and length (2000
steps), under AdamW (lr 1e-3, the baseline's) and under Muon (lr 5e-3, the optimizers sweep's best): cosine to
lr/10 (the baseline), linear to lr/10, constant, and WSD (constant, then linear to lr/10 over the last 20% of the
steps after warmup), all after the baseline's 100 warmup steps; 2 seeds. With cosine this is also the second seed
of the optimizers sweep's Muon finding (1.583 against AdamW's 1.682), which decides the experiment's default.

The schedule and the optimizer are part of the compiled program; each pair's 2 seeds train together (8 programs).
"""

from experiments.ablations import baseline


def get_sweep():
    return {
        "experiment": "experiments/shakespeare_char.py",
        "fixed": baseline.shakespeare_char(2000),
        "grid": {"train.schedule": ["cosine", "linear", "constant", "wsd"]},
        "zip": {"train.optimizer": ["adamw", "muon"], "train.learning_rate": [1e-3, 5e-3]},
        "seeds": [0, 1],
    }
