"""The learning-rate schedules (issue 20.2) on the shakespeare_char baseline at its full shape and length (2000
steps), under AdamW (lr 1e-3, the baseline's): linear to lr/10, constant, and WSD (constant, then linear to lr/10
over the last 20% of the steps after warmup), all after the baseline's 100 warmup steps, seeds 1 and 2. The
baseline's own schedule, cosine to lr/10, is the no-option point of the model_options sweep (the same settings,
seeds 0-2): compare with its seeds 1 and 2. One more point, Muon (lr 5e-3, the optimizers sweep's best) with the
cosine schedule, gives that sweep's Muon finding (1.583 against AdamW's 1.682 at seed 0) its seeds 1 and 2, which
decide the experiment's default. (Muon's step costs ~2.2x AdamW's here: its other schedules are left out to keep
the sweep within the CPU time of one session.)

The schedule and the optimizer are part of the compiled program; each point's seeds train together (4 programs).
"""

from experiments.ablations import baseline


def get_sweep():
    return {
        "experiment": "experiments/shakespeare_char.py",
        "fixed": baseline.shakespeare_char(2000),
        "zip": {
            "train.schedule": ["linear", "constant", "wsd", "cosine"],
            "train.optimizer": ["adamw"] * 3 + ["muon"],
            "train.learning_rate": [1e-3] * 3 + [5e-3],
        },
        "seeds": [1, 2],
    }
