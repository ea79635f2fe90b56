"""Multi-token prediction (DeepSeek-V3's modules after the decoder, model.mtp_depth) at depth 0, 1 and 2 at equal
compute: the same 768 tokens a step, and steps in inverse proportion to the train FLOPs per token. A depth adds one
block (attention and FFN, as a decoder layer) and its 2d -> d projection; the FLOPs per token are `run.py inspect`'s
6N + 12 L d T (5,175,552 / 6,559,488 / 7,943,424 at depth 0 / 1 / 2) with the attention term 12 d T = 98,304 added
per MTP block (inspect's L counts the decoder's 4 layers only): 5,175,552 / 6,657,792 / 8,140,032, so 500 / 389 /
318 steps. The weight of the depths' mean loss is train.mtp_weight's default 0.3 (DeepSeek-V3's first).
Compared on the next-token valid loss (eval's `loss`: the main head's; the depths' own are mtp_loss_k).
The shakespeare_char baseline (AdamW lr 1e-3, context 64, 12 rows), an eval every 50 steps, 2 seeds (trained
together in one vmapped program per setting); the warmup's 100 steps and the cosine over each run's own steps.
"""

from experiments.ablations import baseline


def get_sweep():
    return {
        "experiment": "experiments/shakespeare_char.py",
        "fixed": {**baseline.shakespeare_char(500), "train.eval_every": 50},
        "zip": {"model.mtp_depth": [0, 1, 2], "train.steps": [500, 389, 318]},
        "seeds": [0, 1],
    }
