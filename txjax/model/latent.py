"""Multi-head latent attention, MLA (DeepSeek-V2, DeepSeek-AI 2024, sec. 2.1; DeepSeek-V3): each head's key and
value rebuilt from one compressed latent per token, so that a KV cache holds the latent and one shared RoPE key.

    q_h = RMSNorm(x W^DQ) W^UQ_h            (q_lora_rank = 0: x W^Q_h)         q_h = [q^R_h ; q^C_h]
    [c ; k^R] = x W^DKV,  c <- RMSNorm(c)    k^R: one RoPE key shared by every head
    k_h = [k^R ; c W^UK_h],  v_h = c W^UV_h,  out = Concat_h(Attention(q_h, k_h, v_h)) W^O

with q^R_h and k^R rotated by RoPE. Training attends over the rebuilt heads through MultiHeadAttention's `heads`
(the one score function, txjax.model.score; the reference and blockwise backends, not the fused kernels nor ring
attention, whose values must be as wide as the keys). Decoding caches c and k^R per token
(kv_cache's LATENT and ROPE_KEY: kv_lora_rank + qk_rope_head_dim values per token and layer) and attends in the
absorbed form: q_h . k_h = q^R_h . k^R + (W^UK_h q^C_h) . c, so each query takes W^UK_h in, the heads attend over
[k^R ; c] as one shared K/V head whose values are c (multi-query attention), and W^UV_h maps each head's output
after attention. Both forms scale the scores by the rebuilt heads' 1/sqrt(qk_nope + qk_rope) (head_dim) times
YaRN's mscale^2 (score.Spec.multiplier). A head's channels are ordered [rope ; nope] (transformers': [nope ; rope]),
which no dot product sees, so that RoPE rotates its first channels as positional.rotate does.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from txjax.model import kv_cache, positional, precision, ring_attention, roles
from txjax.model.config import PLAIN_LAYER
from txjax.model.multi_head import MultiHeadAttention
from txjax.model.norms import rms_norm


class LatentAttention(MultiHeadAttention):
    """MLA in MultiHeadAttention's place (self-attention; its `heads`, `attend` and `project_out`): head_dim is the
    query/key width qk_rope + qk_nope, num_kv_heads = num_heads. Weights: q [D, H, K] or q_down [D, Q], q_norm,
    q_up [Q, H, K]; kv_down [D, C + R], kv_norm; key_up [C, H, K - R]; value_up [C, H, V]; out [H, V, D]."""

    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    rope_dim: int = 0  # qk_rope_head_dim
    v_head_dim: int = 0

    @nn.compact
    def __call__(
        self,
        x_BxLxD,
        mask,
        *,
        q_pos,
        kv=None,
        k_pos=None,
        causal=False,
        layer=PLAIN_LAYER,
        deterministic=True,
        decode=False,
        relative_table=None,
    ):
        """MultiHeadAttention's call for self-attention (kv and k_pos unused: the keys are x's); -> [B, L, D]."""
        if ring_attention.serves():  # its key shards' merge holds values of the keys' width
            raise ValueError(
                "ring attention (mesh.sequence > 1) has no form for model.attention=mla: set mesh.sequence=1"
            )
        by_segments, mask = self.backend(mask, decode)
        q_BxLxHxK = self.queries(x_BxLxD)
        c_BxLxC, kr_BxLxR = self.latent(x_BxLxD)
        cos, sin = positional.rope_tables(q_pos, *self.rope.frequencies(self.rope_dim))
        q_BxLxHxK = positional.rotate(q_BxLxHxK, cos, sin)  # its first rope_dim channels
        kr_BxLxR = positional.rotate(kr_BxLxR[:, :, None], cos, sin)[:, :, 0]
        key_up, value_up = self.up("key_up", self.head_dim - self.rope_dim), self.up("value_up", self.v_head_dim)
        attention = dict(deterministic=deterministic, relative_table=relative_table, bidirectional=not causal, window=0)
        if not decode:
            k_nope = precision.einsum("blc,chn->blhn", c_BxLxC, key_up)
            k_BxLxHxK = jnp.concatenate([jnp.broadcast_to(kr_BxLxR[:, :, None], (*k_nope.shape[:3], self.rope_dim)),
                                         k_nope], axis=-1)  # fmt: skip
            v_BxLxHxV = precision.einsum("blc,chv->blhv", c_BxLxC, value_up)
            out = self.heads(
                q_BxLxHxK, k_BxLxHxK, v_BxLxHxV, mask, q_pos, q_pos, by_segments, causal=causal, **attention
            )
            return self.project_out(out, x_BxLxD.shape[-1])
        c_BxSxC, kr_BxSxR, k_pos, mask = kv_cache.append_kv_cache(
            self, c_BxLxC, kr_BxLxR, q_pos, mask, names=(kv_cache.LATENT, kv_cache.ROPE_KEY)
        )  # the cache's mask holds the causal order of its slots
        q_rope, q_nope = jnp.split(q_BxLxHxK, [self.rope_dim], axis=-1)
        q_absorbed = jnp.concatenate([q_rope, precision.einsum("blhn,chn->blhc", q_nope, key_up)], axis=-1)
        k_shared = jnp.concatenate([kr_BxSxR, c_BxSxC], axis=-1)[:, :, None]  # [B, S, 1, R + C]
        out_BxLxHxC = self.heads(
            q_absorbed, k_shared, c_BxSxC[:, :, None], mask, q_pos, k_pos, None, causal=False, **attention
        )
        out = precision.einsum("blhc,chv->blhv", out_BxLxHxC, value_up.astype(out_BxLxHxC.dtype))
        return self.project_out(out, x_BxLxD.shape[-1])

    def matrix(self, name, shape, spec, role):
        """A weight ~ N(0, init_std^2) in the compute dtype."""
        init = roles.init(nn.initializers.normal(self.init_std), spec, role)
        return self.param(name, init, shape).astype(self.dtype)

    def queries(self, x_BxLxD):
        """q [B, L, H, K]: x W^Q, or RMSNorm(x W^DQ) W^UQ with q_lora_rank > 0."""
        d, heads = x_BxLxD.shape[-1], (self.num_heads, self.head_dim)
        x = x_BxLxD.astype(self.dtype)
        if not self.q_lora_rank:
            return precision.einsum(
                "bld,dhk->blhk", x, self.matrix("q", (d, *heads), ("embed", "heads", "kv"), roles.QKV)
            )
        down = self.matrix("q_down", (d, self.q_lora_rank), ("embed", None), roles.MATRIX)
        c_q = rms_norm(self.norm_eps, False, "kv", "q_norm")(precision.einsum("bld,dq->blq", x, down))
        up = self.matrix("q_up", (self.q_lora_rank, *heads), (None, "heads", "kv"), roles.QKV)
        return precision.einsum("blq,qhk->blhk", c_q.astype(self.dtype), up)

    def latent(self, x_BxLxD):
        """x W^DKV split into the latent c [B, L, C] (RMSNorm'd) and the shared RoPE key k^R [B, L, R], unrotated."""
        shape = (x_BxLxD.shape[-1], self.kv_lora_rank + self.rope_dim)
        down = self.matrix("kv_down", shape, ("embed", None), roles.MATRIX)
        c, kr = jnp.split(precision.einsum("bld,dc->blc", x_BxLxD.astype(self.dtype), down), [self.kv_lora_rank], -1)
        return rms_norm(self.norm_eps, False, "kv", "kv_norm")(c).astype(self.dtype), kr

    def up(self, name, width):
        """W^UK or W^UV [C, H, width]: the latent into each head's key (no RoPE) or value channels."""
        return self.matrix(name, (self.kv_lora_rank, self.num_heads, width), (None, "heads", "kv"), roles.QKV)
