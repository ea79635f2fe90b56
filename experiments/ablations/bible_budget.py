"""Dropout and peak learning rate for bible_en_es under its 20-minute budget (issue 8): ~1,500 steps of 16 packed
rows are ~2.3 passes over the 30,521 training pairs, an under-trained regime in which regularisation may cost
more than it gives. Equal steps (1,500) rather than equal minutes, so that the runs can share the cores and still
be compared (dropout costs ~3% of a step on its own). Read the valid loss and the final eval's greedy BLEU.
The two learning rates of one dropout train together in one vmapped program.
"""

from experiments.ablations import baseline


def get_sweep():
    return {
        "experiment": "experiments/bible_en_es.py",
        "fixed": baseline.bible_en_es(1500),
        "grid": {"model.dropout": [0.1, 0.0], "train.learning_rate": [1e-3, 2e-3]},
        "metrics": ["valid_loss", "valid_bleu"],
    }
