"""The shakespeare_char defaults against nanoGPT's recipe, 3 seeds each, full shape and budget (4 layers, 4 heads,
d_model 128, context 64, batch 12, 2000 steps, bfloat16): nanoGPT's choices (learned positions, GELU, lr 1e-3), and
the two best candidates the ablations and the lr_schedule sweep point to: RoPE and ReLU (500-step ablations) with
1/sqrt(d_k) scaling at lr 4e-3, or unscaled scores at lr 1e-3 (the best two of lr_schedule, 1.778 and 1.756).
"""

from experiments.ablations import baseline


def get_sweep():
    return {
        "experiment": "experiments/shakespeare_char.py",
        "fixed": baseline.shakespeare_char(2000),
        "zip": {
            "model.positional": ["learned", "rope", "rope"],
            "model.activation": ["gelu", "relu", "relu"],
            "model.attention_scale": ["sqrt", "sqrt", "none"],
            "train.learning_rate": [1e-3, 4e-3, 1e-3],
        },
        "seeds": [0, 1, 2],
    }
