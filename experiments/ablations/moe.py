"""Dense FFN against mixture-of-experts FFNs at equal active parameters per token (issue 57.5): the dense d_ff = 512
(2 x 128 x 512 = 131,072 FFN weights per token and layer) against 8 and 16 experts, top-2, each of width 256
(2 x 2 x 128 x 256: the same), and the same with one shared expert, where the 2 routed and the 1 shared expert are each
171 wide (3 x 2 x 128 x 171 = 131,328); each MoE with the load-balancing loss (train.moe_aux_weight 0.01, the default)
and without it. Every layer is MoE, Mixtral's router, dropless. The router adds D x X weights per layer (1,024 or
2,048), and the parameters stored grow with X: MoE holds 4x (8 experts) or 8x (16) the dense FFN's weights.

The shakespeare_char baseline (AdamW lr 1e-3) at 400 steps (the other ablations: 500; 9 programs had to fit about an
hour of 2 cores shared with other jobs), an eval every 100 steps for the curves, 2 seeds: each setting's 2 seeds train
together in one vmapped program, the settings in the order below (most informative first: a sweep cut short for time
still compares dense, 8 and 16 experts, aux loss on and off, and a shared expert).
"""

from experiments.ablations import baseline

DENSE, ROUTED, WITH_SHARED = None, 256, 171  # moe_d_ff: None = the dense FFN's d_ff


def get_sweep():
    settings = [  # (experts, shared experts, moe_d_ff, aux weight)
        (0, 0, DENSE, 0.01),
        (8, 0, ROUTED, 0.01),
        (8, 0, ROUTED, 0.0),
        (16, 0, ROUTED, 0.01),
        (8, 1, WITH_SHARED, 0.01),
        (16, 0, ROUTED, 0.0),
        (8, 1, WITH_SHARED, 0.0),
        (16, 1, WITH_SHARED, 0.01),
        (16, 1, WITH_SHARED, 0.0),
    ]
    fields = ("model.num_experts", "model.num_shared_experts", "model.moe_d_ff", "train.moe_aux_weight")
    return {
        "experiment": "experiments/shakespeare_char.py",
        "fixed": {**baseline.shakespeare_char(400), "train.eval_every": 100},
        "zip": {field: [s[i] for s in settings] for i, field in enumerate(fields)},
        "seeds": [0, 1],
    }
