"""txjax: transformers in JAX/Flax Linen, every equation a function you can point at."""

from txjax.attention import (MultiHeadAttention, attention_weights, causal_mask, combine_masks, padding_mask,
                             scaled_dot_product_attention, segment_mask, valid_from_lengths, valid_from_pad_id)
from txjax.models import DecoderLM, EncoderDecoder, ModelConfig, init_cache

__version__ = "0.1.0"
