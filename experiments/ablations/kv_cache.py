"""MHA against GQA against MLA at equal KV-cache bytes per token: every setting caches 128 numbers per token and
layer (1,024 bytes a token over the 4 layers in bfloat16, `run.py inspect`'s "KV cache per token"), half the
baseline's 4 heads x 32 x (K, V) = 256:
    MHA  2 heads of d_k 32 (model.d_head=32): 2 x 32 keys + 2 x 32 values                      665,984 parameters
    GQA  4 query heads of d_k 32 sharing 2 K/V heads (model.num_kv_heads=2): 2 x 32 + 2 x 32   731,520 parameters
    MLA  4 heads (DeepSeek-V2's multi-head latent attention, model.attention=mla): a latent of 112
         (kv_lora_rank) and one shared RoPE key of 16 (qk_rope_head_dim) = 128; each head's key is 32 channels
         rebuilt from the latent (qk_nope_head_dim) + the 16 RoPE ones, its value 32 (v_head_dim)   879,424 parameters
Equal cache, not equal parameters: what each design buys with the same memory a decoded token costs.
The shakespeare_char baseline (AdamW lr 1e-3, context 64, 12 rows) at 500 steps, an eval every 50 steps for the
curves, 2 seeds (trained together in one vmapped program per setting).
"""

from experiments.ablations import baseline

MLA = {"model.kv_lora_rank": 112, "model.qk_rope_head_dim": 16, "model.qk_nope_head_dim": 32, "model.v_head_dim": 32}


def get_sweep():
    return {
        "experiment": "experiments/shakespeare_char.py",
        "fixed": {**baseline.shakespeare_char(500), "train.eval_every": 50},
        "zip": {
            "model.attention": ["mha", "mha", "mla"],
            "model.num_heads": [2, 4, 4],
            "model.d_head": [32, None, None],
            "model.num_kv_heads": [None, 2, None],
            **{field: [0, 0, size] for field, size in MLA.items()},
        },
        "seeds": [0, 1],
    }
