"""txjax: transformers in JAX/Flax Linen, every equation a function you can point at.

Shape letters, used in names (`x_BxLxD`, `q_BxLxHxK`) and comments across the package:
    B  batch rows                     L  query / target length       S  key length (source, or the KV cache)
    D  d_model                        F  d_ff (feed-forward width)   V  vocabulary
    H  query heads                    G  KV heads (grouped-query)    K  head dim d_k
    N  layers                         R  stacked runs (a vmapped sweep group)
    I  a dense layer's input features O  a dense layer's output features
    W  beams per row (beam search)    T  steps of a decode loop (new tokens)   P  prompt length
    C  rows a decode loop runs (decode/, families/): B x W in beam search, B x num_samples in sampling, else B
    E  entries of a data set (data/): documents, sentence pairs, packed pieces
    X  experts (model/moe.py)         J  experts chosen per token    M  tokens of a call, B x L    A  assignments, M x J
Axes are joined by "x". Letters written together multiply (`_BxWV`: W*V candidates per row), a digit before a letter
multiplies (`_Bx2W`, `_Dx3D`), a digit after one adds (`_BxL1`: L + 1 tokens), a digit alone is that size (`_Ex2`).
"""

from txjax.decode.cache import init_cache
from txjax.model.attention import attention_weights, scaled_dot_product_attention
from txjax.model.config import ModelConfig
from txjax.model.masks import causal_mask, padding_mask, segment_mask, window_mask
from txjax.model.models import DecoderLM, EncoderDecoder
from txjax.model.multi_head import MultiHeadAttention

__all__ = [
    "DecoderLM",
    "EncoderDecoder",
    "ModelConfig",
    "MultiHeadAttention",
    "attention_weights",
    "causal_mask",
    "init_cache",
    "padding_mask",
    "scaled_dot_product_attention",
    "segment_mask",
    "window_mask",
]
__version__ = "0.1.0"
