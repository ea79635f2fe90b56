"""English -> Spanish translation of Bible verses with a Transformer encoder-decoder (Vaswani et al. 2017, scaled
down for a CPU): 3 + 3 layers, d_model 256, sinusoidal positions, dropout 0.1, label smoothing 0.1; pre-LN (the
paper's post-LN: --config.model.norm_placement=post).

Tokenizer: one SentencePiece unigram model of 8000 pieces shared by both languages, trained on both sides of the
training file on the first run and kept in the workdir's tokenizer/. Pairs are packed into rows of 128 tokens.
Evaluated on valid.en-es.tsv (loss, perplexity, token accuracy; BLEU with `run.py generate`).
"""

from txjax.config import base_config


def get_config():
    config = base_config()
    config.family = "encoder_decoder"
    bible = "../shared/data/bible/{}.en-es.tsv"
    config.data.update(kind="parallel", path=bible.format("train"), valid_path=bible.format("valid"),
                       test_path=bible.format("test"), tokenizer="sentencepiece", vocab_size=8000, max_src_len=128,
                       max_tgt_len=128, pack=True)
    config.model.update(num_layers=3, num_encoder_layers=3, num_heads=4, d_model=256, d_ff=1024, dropout=0.1,
                        positional="sinusoidal", embed_scale=True, share_embeddings=True, tie_embeddings=True)
    config.train.update(steps=6000, batch_size=32, learning_rate=7e-4, warmup_steps=400, label_smoothing=0.1,
                        log_every=50, eval_every=500, eval_batches=0, checkpoint_every=500)
    config.decode.update(max_new_tokens=160, beam_size=4, length_penalty=0.6)
    return config
