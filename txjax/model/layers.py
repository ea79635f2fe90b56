"""The transformer block, from attention, the FFN and the norms (txjax.model.norms).

Block, pre-LN (Xiong et al. 2020; GPT-2):     t1 = LN(x);  t3 = x + MHA(t1);  h = t3 + FFN(LN(t3))
Block, post-LN (Vaswani et al. 2017):         t3 = LN(x + MHA(x));  h = LN(t3 + FFN(t3))
Block, sandwich (pre-LN and a norm LN' of each branch's output: Ding et al. 2021, CogView; Gemma 2 and 3):
                                              t3 = x + LN'(MHA(LN(x)));  h = t3 + LN'(FFN(LN(t3)))
A decoder block of an encoder-decoder adds cross-attention over the encoder output between the two, and the FFN
reads t5 instead of t3:                       t5 = t3 + CrossMHA(LN(t3), enc)   (pre-LN; sandwich: LN'(CrossMHA))
                                              t5 = LN(t3 + CrossMHA(t3, enc))   (post-LN)
FFN(x) = act(x W1 + b1) W2 + b2 (ReLU in the 2017 paper, GELU in GPT-2); SwiGLU(x) = (silu(x W1) * x W3) W2
(txjax.model.ffn); in an MoE layer the FFN is a mixture of experts (txjax.model.moe). With model.moe_every = n > 1
every n-th layer is MoE: the stack repeats a Group of n blocks, n - 1 dense then one MoE; model.moe_dense_first = k
puts k dense layers before them (a stack of their own, models.Stack).
Dropout is applied to each residual branch before the addition and is off when deterministic.
"""

from __future__ import annotations

import functools

import flax.linen as nn

from txjax.model import score
from txjax.model.attention import resolve_impl
from txjax.model.config import PLAIN_LAYER, LayerAttention, ModelConfig
from txjax.model.ffn import FeedForward
from txjax.model.gated_deltanet import GatedDeltaNet
from txjax.model.latent import LatentAttention
from txjax.model.moe import MoE
from txjax.model.multi_head import MultiHeadAttention
from txjax.model.norms import make_norm
from txjax.parallel.sharding import BATCH_LENGTH, constrain


def make_ffn(cfg: ModelConfig, moe: bool, name: str = "ffn") -> nn.Module:
    """The block's FFN: a mixture of experts (txjax.model.moe) in an MoE layer, else the dense FeedForward."""
    return MoE(cfg, name=name) if moe else FeedForward(cfg, name=name)


def make_attention(cfg, cross: bool, name: str, sow_weights=False):
    """The one attention module, configured for self- (rope/alibi apply) or cross-attention (they do not);
    model.attention=mla's self-attention is LatentAttention (txjax.model.latent), MultiHeadAttention's kin."""
    latent = cfg.attention == "mla" and not cross
    sizes = dict(q_lora_rank=cfg.q_lora_rank, kv_lora_rank=cfg.kv_lora_rank, rope_dim=cfg.qk_rope_head_dim)
    return (functools.partial(LatentAttention, **sizes, v_head_dim=cfg.v_head_dim) if latent else MultiHeadAttention)(
        num_heads=cfg.num_heads,
        num_kv_heads=cfg.num_heads if latent else cfg.kv_heads,
        head_dim=cfg.qk_head_dim if latent else cfg.head_dim,
        dtype=cfg.compute_dtype,
        use_bias=cfg.use_bias or cfg.attention_bias,
        qkv_bias=cfg.qkv_bias,
        dropout=cfg.attention_dropout,
        score=score.spec_of(cfg, cross),
        impl=resolve_impl(cfg.attention_impl, cfg.compute_dtype, cfg.head_dim, bool(score.fused_lacks(cfg)) or latent),
        block_sizes=(cfg.attention_block_q, cfg.attention_block_kv),
        rope=cfg.rope if (not cross and cfg.positional == "rope") else None,
        local_rope=cfg.local_rope,
        qk_norm=cfg.qk_norm,
        qk_norm_all_heads=cfg.qk_norm_all_heads,
        norm_eps=cfg.norm_eps,
        qk_l2_norm=cfg.qk_l2_norm and not cross,
        chunk=0 if cross else cfg.attention_chunk,
        temperature=(0.0 if cross else cfg.attention_temperature, cfg.attention_floor_scale),
        norm_offset=cfg.norm_offset,
        output_gate=cfg.attention_output_gate,
        sow_weights=sow_weights,
        cross=cross,
        init_std=cfg.hidden_init_std,
        out_init_std=cfg.out_init_std,
        name=name,
    )


class Block(nn.Module):
    """One transformer layer: self-attention, optional cross-attention, FFN, each a residual branch.

    Signature fits nn.scan: (x, ctx, layer) -> (x, None) with ctx (masks, positions, encoder output) broadcast and
    `layer`, what this layer's self-attention has of its own (config.LayerAttention: its local window, an int, 0 =
    global), broadcast (Python ints) or scanned (traced scalars). A linear layer (`linear`: its LayerAttention's,
    given by the stack as a module field so that it stays a Python bool under remat's tracing) mixes its tokens by
    Gated DeltaNet (txjax.model.gated_deltanet) in place of MHA; the rest is the same.
    """

    cfg: ModelConfig
    cross: bool = False  # decoder block of an encoder-decoder
    causal: bool = False  # self-attention in causal order (a decoder) on top of ctx's mask
    sow_weights: bool = False
    deterministic: bool = True  # no dropout (eval, decode)
    decode: bool = False  # write keys/values into the KV cache
    moe: bool = False  # the FFN is a mixture of experts
    linear: bool = False  # Gated DeltaNet mixes the tokens (LayerAttention.linear)

    @nn.compact
    def __call__(self, x_BxLxD, ctx, layer=PLAIN_LAYER):
        """ctx: dict with 'mask' (blockwise.Segments [B, L] twice; `causal` adds the causal order), 'pos' [B,L], and
        for cross blocks 'enc' [B,S,D] (None on cached decode steps) and 'enc_mask' (Segments [B, L], [B, S]). The
        hidden states are laid out as activations (rows over data x fsdp, the length over sequence) on the mesh in
        context."""
        cfg, deterministic, decode = self.cfg, self.deterministic, self.decode
        x_BxLxD = constrain(x_BxLxD, (*BATCH_LENGTH, None))
        dropout = nn.Dropout(cfg.dropout)
        drop = lambda y: dropout(y, deterministic=deterministic)  # on each residual branch, before the addition
        ln = lambda name: make_norm(cfg, f"{name}_norm")
        mixer = "linear_attention" if self.linear else "self_attention"  # the token mixer: MHA or Gated DeltaNet
        if self.linear:
            delta_net = GatedDeltaNet(cfg, name=mixer)
            mha = lambda t: delta_net(t, ctx["mask"], decode=decode)
        else:
            self_attn = make_attention(cfg, False, mixer, self.sow_weights)
            mha = lambda t: self_attn(
                t,
                ctx["mask"],
                q_pos=ctx["pos"],
                causal=self.causal,
                layer=layer,
                deterministic=deterministic,
                decode=decode,
                relative_table=ctx.get("relative_table"),  # T5's bucketed bias, one table per stack (models.Stack)
            )
        if self.cross:
            cross_attn = make_attention(cfg, True, "cross_attention", self.sow_weights)
            kv, mask = ctx["enc"], ctx["enc_mask"]
            cross = lambda t: cross_attn(t, mask, q_pos=ctx["pos"], kv=kv, deterministic=deterministic, decode=decode)
        ffn = make_ffn(cfg, self.moe)
        x = x_BxLxD

        if cfg.norm_placement in ("pre", "sandwich"):  # Xiong et al. 2020; GPT-2 (sandwich: + each branch's LN')
            sandwich = cfg.norm_placement == "sandwich"
            branch = lambda name, y: make_norm(cfg, f"{name}_post_norm")(y) if sandwich else y  # LN' of its output
            t1 = ln(mixer)(x)
            t3 = x + drop(branch(mixer, mha(t1)))
            t5 = t3 + drop(branch("cross_attention", cross(ln("cross_attention")(t3)))) if self.cross else t3
            h = t5 + drop(branch("ffn", ffn(ln("ffn")(t5))))
        else:  # post-LN, Vaswani et al. 2017
            t3 = ln(mixer)(x + drop(mha(x)))
            t5 = ln("cross_attention")(t3 + drop(cross(t3))) if self.cross else t3
            h = ln("ffn")(t5 + drop(ffn(t5)))
        return h.astype(x_BxLxD.dtype), None


class Group(nn.Module):
    """n consecutive layers ('block_0', ..., 'block_{n-1}'), every model.moe_every-th one MoE: the unit the stack
    scans (or loops) over when MoE layers alternate with dense ones or linear layers with full ones (n: the periods'
    least common multiple, models.Stack). Block's signature."""

    cfg: ModelConfig
    size: int = 1
    linear: tuple[bool, ...] = ()  # each block's LayerAttention.linear (the same in every group); () = none linear
    moe: bool = False  # its every moe_every-th block is MoE (False: a dense prefix's group, model.moe_dense_first)
    cross: bool = False
    causal: bool = False
    sow_weights: bool = False
    deterministic: bool = True
    decode: bool = False

    @nn.compact
    def __call__(self, x_BxLxD, ctx, layer=PLAIN_LAYER):
        """layer: the blocks' LayerAttention, one of ints for all, or fields of n values (ints, or a scanned
        group's [n] arrays)."""
        cfg, n = self.cfg, self.size
        kwargs = dict(cfg=cfg, cross=self.cross, causal=self.causal, sow_weights=self.sow_weights)
        kwargs |= dict(deterministic=self.deterministic, decode=self.decode)
        for j in range(n):
            block_layer = LayerAttention(*(field if isinstance(field, int) else field[j] for field in layer))
            moe = self.moe and (j + 1) % cfg.moe_every == 0
            linear = bool(self.linear and self.linear[j])
            x_BxLxD, _ = Block(**kwargs, moe=moe, linear=linear, name=f"block_{j}")(x_BxLxD, ctx, block_layer)
        return x_BxLxD, None
