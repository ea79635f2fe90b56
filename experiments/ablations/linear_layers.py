"""All-softmax attention against three Gated DeltaNet layers to one of full attention (model.layer_types=LLLF, Qwen3-
Next's 3:1) at equal parameters: the linear layers have 2 query/key heads and 4 value heads of 32 channels
(linear_heads=2, linear_v_heads=4: more value than key heads, as Qwen3-Next), 803,320 parameters against the
all-softmax model's 797,056 (+0.8%; at the attention's 4 + 4 heads the LLLF model has 854,008, +7%).
The shakespeare_char baseline (AdamW lr 1e-3, context 64, 12 rows) at 500 steps, an eval every 50 steps for the
curves against time, 2 seeds (trained together in one vmapped program per setting); evals/linear_extension.py then
reads the loss by position at 4x the training context (256).
"""

from experiments.ablations import baseline


def get_sweep():
    return {
        "experiment": "experiments/shakespeare_char.py",
        "fixed": {**baseline.shakespeare_char(500), "train.eval_every": 50},
        "zip": {
            "model.layer_types": ["", "LLLF"],
            "model.linear_heads": [0, 2],
            "model.linear_v_heads": [0, 4],
        },
        "seeds": [0, 1],
    }
