"""Multi-token prediction (DeepSeek-V3, Liu et al. 2024, sec. 2.2): model.mtp_depth = D modules after the decoder,
module k predicting the token k places past the next one, sharing the embedding E and the LM head.

    h^0_i = the decoder's output at position i (after its final norm), e_j = E[t_j] (the token embedding alone)
    h^k_i = Block_k(W_k [Norm(e_{i+k}); Norm(h^{k-1}_i)])      W_k [2D -> D], Block_k a causal decoder layer
    logits^k_i = Head(Norm_k(h^k_i)), whose target is t_{i+k+1}                                  k = 1 .. D
The halves are in the order of DeepSeek-V3's released weights (enorm, hnorm, eh_proj; the paper writes [h; e]), so
that their eh_proj is W_k as it is. The norms are the model's (RMSNorm in DeepSeek-V3). Block_k is a layer of the
model's own kind (an MoE layer when the model has experts, as DeepSeek-V3's), global and with RoPE. Its mask is the
decoder's: position i reads only positions j <= i, whose inputs e_{j+k} lie at or before i + k, so a depth-k target
in i's document reads nothing past it nor outside the document.

The modules run only when the caller asks for their collection (MTP mutable: the training and eval forward pass,
txjax.families.objective.forward), so decoding, scoring and every other forward pass compute the model without them.
Their loss: txjax.families.objective.mtp_sums.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from txjax.model import adapters, precision
from txjax.model.config import ModelConfig
from txjax.model.ffn import dense
from txjax.model.layers import Block
from txjax.model.norms import make_norm

MTP = "mtp"  # the collection the modules' logits are sown into ("logits": one [B, L, V] per depth, in order)


def shift(x_BxL, k: int):
    """x[:, i + k] at each position i, zeros past the end: [B, L, ...] -> the same shape."""
    kept = x_BxL[:, k:]
    return jnp.pad(kept, [(0, 0), (0, x_BxL.shape[1] - kept.shape[1])] + [(0, 0)] * (x_BxL.ndim - 2))


def depth_labels(targets_BxL, weights_BxL, segments_BxL, k: int):
    """Depth k's (targets, weights) [B, L]: position i's target is t_{i+k+1} = targets[i + k], weighted by that
    target's own weight where position i + k is in i's document (segment), else 0 (past the row's end too)."""
    same_BxL = shift(segments_BxL, k) == segments_BxL
    return shift(targets_BxL, k), shift(weights_BxL, k) * same_BxL


class Depth(nn.Module):
    """One module k: (h^{k-1}, e shifted by k, the decoder's ctx) -> (h^k, the next depth's input; Norm_k(h^k), the
    head's)."""

    cfg: ModelConfig
    deterministic: bool = True
    decode: bool = False  # its block's keys and values cached (txjax.decode.speculative's drafts)

    @nn.compact
    def __call__(self, h_BxLxD, e_BxLxD, ctx):
        cfg = self.cfg
        both = jnp.concatenate([make_norm(cfg, "embed_norm")(e_BxLxD), make_norm(cfg, "hidden_norm")(h_BxLxD)], -1)
        x_BxLxD = dense(cfg.d_model, ("mlp", "embed"), False, cfg.compute_dtype, cfg.hidden_init_std, "proj")(both)
        block = adapters.merging(self, Block)(
            cfg,
            causal=True,
            deterministic=self.deterministic,
            decode=self.decode,
            moe=cfg.num_experts > 0,
            name="block",
        )
        h_BxLxD = block(x_BxLxD, ctx)[0]
        return h_BxLxD, make_norm(cfg, "head_norm")(h_BxLxD)


class Modules(nn.Module):
    """The D modules ('depth_1', ...): (h^0 [B, L, D], token embeddings e [B, L, D], the decoder's ctx) -> each
    depth's normed output Norm_k(h^k) [B, L, D], for the shared head."""

    cfg: ModelConfig
    deterministic: bool = True

    @nn.compact
    def __call__(self, h_BxLxD, e_BxLxD, ctx):
        outputs = []
        with precision.matmul_precision(self.cfg.matmul_precision, self.cfg.compute_dtype):
            for k in range(1, self.cfg.mtp_depth + 1):
                h_BxLxD, normed_BxLxD = Depth(self.cfg, self.deterministic, name=f"depth_{k}")(
                    h_BxLxD, shift(e_BxLxD, k), ctx
                )
                outputs.append(normed_BxLxD)
        return outputs
