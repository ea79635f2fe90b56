"""The two model families: a decoder-only LM and an encoder-decoder (their frozen config: txjax/model/config.py).

DecoderLM:       logits = Head(LN(Blocks(Embed(tokens) + PE(positions))))            (GPT-2 / nanoGPT)
EncoderDecoder:  enc = LN(EncoderBlocks(Embed(src) + PE));  logits = Head(LN(DecoderBlocks(Embed(tgt) + PE, enc)))
                 (Vaswani et al. 2017, fig. 1; the decoder blocks add cross-attention over `enc`)
The LM head is x E^T when tied to the token embedding E, else a separate [d_model, vocab] matrix (plus a bias b on
the logits with final_logits_bias, Marian's and BART's); embed_norm adds a LN of each stack's input (BART's
layernorm_embedding).
muP (`parametrization="mup"`, Yang et al. 2022, "Tensor Programs V", Table 8, the formulation with multipliers), with
width multiplier m = d_model / base_width: hidden (matrix-like) weights, the attention and FFN kernels, are drawn
with variance init_std^2 / m (1/fan_in) and take Adam learning rate lr / m (txjax.state.optim.mup_lr_multipliers);
vector-like weights (token and position embeddings, norms, biases) keep init and learning rate; the readout is
multiplied by 1/m; scores are scaled by 1/d_k (attention_scale="linear", required). The head is vector-like too,
init and lr unchanged, so a tied head is the same matrix as the input embedding: Table 8 gives input and output
weights the same (width-independent) init and Adam lr and puts the width in the output multiplier 1/m, which is
what lets muP tie them (mup's MuSharedReadout). At m = 1 muP is the standard parametrization with 1/d_k scores.
Layers are stacked with nn.scan (one compiled body, compile time flat in depth) or a Python loop (`scan_layers`).
Cached decoding runs these modules with decode=True; the methods a decoding layout replaces then (attention's
projections, cache and heads, the FFN's hidden layer, nn.Dense) are declared in txjax/model/replaceable.py.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from txjax.model import adapters, mtp, positional, precision, roles
from txjax.model.activations import soft_cap
from txjax.model.blockwise import Segments
from txjax.model.config import PLAIN_LAYER, LayerAttention, ModelConfig
from txjax.model.ffn import dense
from txjax.model.layers import Block, Group
from txjax.model.moe import MOE_STATS
from txjax.model.norms import make_norm


class LogitsBias(nn.Module):
    """z + b, b [V] a learned bias on the logits (zeros at init): Marian's and BART's final_logits_bias."""

    vocab_size: int

    @nn.compact
    def __call__(self, logits_BxLxV):
        init = roles.init(nn.initializers.zeros, ("vocab",), roles.BIAS)
        return logits_BxLxV + self.param("bias", init, (self.vocab_size,))


class Embedder(nn.Module):
    """Token embedding (+ absolute positional encoding): [B, L] ids -> [B, L, D]; and the LM head."""

    cfg: ModelConfig

    def setup(self):
        cfg = self.cfg
        self.tokens = nn.Embed(
            cfg.vocab_size,
            cfg.d_model,
            embedding_init=roles.init(nn.initializers.normal(cfg.init_std), ("vocab", "embed"), roles.EMBEDDING),
        )
        if cfg.positional == "learned":
            self.positions = nn.Embed(
                cfg.max_len,
                cfg.d_model,
                embedding_init=roles.init(nn.initializers.normal(cfg.init_std), ("position", "embed"), roles.EMBEDDING),
            )
        if not cfg.tie_embeddings:
            self.lm_head = dense(
                cfg.vocab_size, ("embed", "vocab"), False, cfg.compute_dtype, cfg.init_std, role=roles.HEAD
            )
        if cfg.final_logits_bias:  # a module, so that an encoder's unshared Embedder (never a head) has none
            self.final_logits_bias = LogitsBias(cfg.vocab_size)

    def __call__(self, tokens_BxL, positions_BxL):
        cfg = self.cfg
        x_BxLxD = self.token_embedding(tokens_BxL)
        if cfg.positional == "learned":
            x_BxLxD = x_BxLxD + self.positions(positions_BxL)
        elif cfg.positional == "sinusoidal":
            x_BxLxD = x_BxLxD + positional.sinusoidal(positions_BxL, cfg.d_model)
        elif cfg.positional == "sinusoidal_halves":
            x_BxLxD = x_BxLxD + positional.sinusoidal_halves(positions_BxL, cfg.d_model)
        return (
            x_BxLxD  # float32: the residual stream stays float32, each matmul casts its inputs (txjax.model.precision)
        )

    def token_embedding(self, tokens_BxL):
        """The tokens' embeddings alone [B, L, D] (times sqrt(d_model) with embed_scale), no position added."""
        return self.tokens(tokens_BxL) * (self.cfg.d_model**0.5 if self.cfg.embed_scale else 1.0)

    def logits(self, x_BxLxD):
        """LM head, float32 logits [B, L, V]: x E^T when tied to the token embedding E, else x W_head; the product
        in the compute dtype (x comes from a float32 norm), accumulated in float32; under muP divided by the width
        multiplier m; plus final_logits_bias b when the config has one; soft-capped when logit_softcap = c > 0:
        c tanh(z / c)."""
        x_BxLxD = x_BxLxD.astype(self.cfg.compute_dtype)
        with precision.matmul_precision(self.cfg.matmul_precision, self.cfg.compute_dtype):
            if not self.cfg.tie_embeddings:
                logits_BxLxV = self.lm_head(x_BxLxD).astype(jnp.float32)
            else:
                embedding_VxD = self.tokens.embedding.astype(x_BxLxD.dtype)
                logits_BxLxV = precision.einsum("bld,vd->blv", x_BxLxD, embedding_VxD, out_dtype=jnp.float32)
        if self.cfg.parametrization == "mup":  # muP's readout multiplier 1/m, tied head or not
            logits_BxLxV = logits_BxLxV / self.cfg.width_multiplier
        if self.cfg.final_logits_bias:
            logits_BxLxV = self.final_logits_bias(logits_BxLxV)
        return soft_cap(logits_BxLxV, self.cfg.logit_softcap)


class Stack(nn.Module):
    """num_layers Blocks, scanned (parameters stacked on a leading 'layers' axis) or looped (layers_0, ...); with
    model.moe_every = n > 1 (and experts), or a model.layer_types pattern of n letters mixing linear and full layers
    (a causal stack's), num_layers / n Groups of n blocks the same way (n: the two periods' least common multiple).
    With model.moe_dense_first = k the first k layers, dense, are a stack of their own before those ('dense_layers',
    looped dense_layers_0, ...), so that each stack's layers share one body.

    Local attention: a causal stack's layers take their windows from cfg.layer_attention. Looped, or scanned with one
    window for all, each is a Python int (static: the fused kernels' local_window_size, a ring-buffer KV cache of
    window slots); scanned with a pattern of local and global layers the windows are a scanned array (one per layer,
    [num_layers / n, n] for Groups), so that one body still serves every layer and the parameter layout is the same:
    the band is then a mask on traced values (blockwise still skips the key blocks outside it) and the KV cache is the
    full one in every layer. Decoding unrolls the layers (txjax.decode.cache.for_decoding), so generation keeps the
    ring buffers."""

    cfg: ModelConfig
    num_layers: int
    cross: bool = False
    causal: bool = False
    sow_weights: bool = False

    @nn.compact
    def __call__(self, x_BxLxD, ctx, deterministic=True, decode=False):
        with precision.matmul_precision(self.cfg.matmul_precision, self.cfg.compute_dtype):
            return self._layers(x_BxLxD, ctx, deterministic, decode)

    def _layers(self, x_BxLxD, ctx, deterministic, decode):
        cfg = self.cfg
        if cfg.embed_norm:  # BART: each stack normalises its own input (the embeddings + positions)
            x_BxLxD = make_norm(cfg, "embed_norm")(x_BxLxD)
        if cfg.positional == "relative_buckets":  # T5: one bias table per stack, read by every layer's attention
            init = roles.init(nn.initializers.normal(cfg.init_std), (None, "heads"), roles.EMBEDDING)
            ctx = {**ctx, "relative_table": self.param("relative_table", init, (cfg.relative_buckets, cfg.num_heads))}
        layers = cfg.layer_attention if self.causal else (PLAIN_LAYER,) * self.num_layers
        k = cfg.moe_dense_first  # DeepSeek-V3's dense layers first: a stack of their own before the MoE layers
        if k:
            x_BxLxD = self._run(x_BxLxD, ctx, layers[:k], False, "dense_layers", deterministic, decode)
        x_BxLxD = self._run(x_BxLxD, ctx, layers[k:], cfg.num_experts > 0, "layers", deterministic, decode)
        return make_norm(cfg, "final_norm")(x_BxLxD) if cfg.norm_placement != "post" else x_BxLxD

    def _run(self, x_BxLxD, ctx, layers, moe, name, deterministic, decode):
        """The consecutive layers whose LayerAttentions are `layers`, scanned as `name` (looped: name_0, ...); moe:
        whether every moe_every-th of them is MoE."""
        cfg = self.cfg
        uniform = len(set(layers)) == 1
        # a Group repeats MoE's period and the linear/full pattern's (a Gated DeltaNet layer's parameters are not an
        # attention layer's, so one body serves every group, never every layer of a mixed stack)
        mixed = len({layer.linear for layer in layers}) > 1
        n = math.lcm(cfg.moe_every if moe else 1, len(cfg.layer_types) if mixed else 1)
        grouped = n > 1
        unit, length = (Group if grouped else Block), len(layers) // n
        # a Group's blocks: one LayerAttention whose fields are tuples of n values
        units = [LayerAttention(*zip(*layers[i * n : (i + 1) * n])) if grouped else layers[i] for i in range(length)]
        static = (3,) if len(set(units)) == 1 or not cfg.scan_layers else ()  # the layer argument: Python values
        remat = dict(prevent_cse=not cfg.scan_layers, static_argnums=static, policy=remat_policy(cfg.remat))
        unit = adapters.merging(self, unit)  # a LoRA run's: each unit merges its own weights (txjax.model.adapters)
        block = nn.remat(unit, **remat) if cfg.remat != "none" else unit
        kwargs = dict(cfg=cfg, cross=self.cross, causal=self.causal, sow_weights=self.sow_weights, moe=moe)
        kwargs |= dict(deterministic=deterministic, decode=decode) | (
            dict(size=n, linear=tuple(layer.linear for layer in layers[:n]))
            if grouped
            else dict(linear=layers[0].linear)  # one kind in every layer
        )
        if cfg.scan_layers:
            # a setting that varies over the layers is scanned (one value per layer), one that does not stays static
            varies = [len(set(field)) > 1 for field in zip(*units)]
            layer = LayerAttention(*(jnp.asarray(f, jnp.int32) if v else f[0] for f, v in zip(zip(*units), varies)))
            scanned = nn.scan(
                block,
                variable_axes={"params": 0, adapters.COLLECTION: 0, "cache": 0, "intermediates": 0, MOE_STATS: 0},
                split_rngs={"params": True, "dropout": True},
                in_axes=(nn.broadcast, LayerAttention(*(0 if v else nn.broadcast for v in varies))),
                length=length,
                metadata_params={nn.PARTITION_NAME: "layers"},
            )
            return scanned(**kwargs, name=name)(x_BxLxD, ctx, layers[0] if uniform else layer)[0]
        for i in range(length):
            x_BxLxD, _ = block(**kwargs, name=f"{name}_{i}")(x_BxLxD, ctx, units[i])
        return x_BxLxD


def remat_policy(name: str):
    """jax.checkpoint's policy of model.remat `name`: what the backward pass reads as saved (the rest it recomputes
    from the block's input). full: nothing; dots_saveable: every matmul's output; dots_with_no_batch_dims_saveable:
    those of matmuls with no batch dimension (the projections, not attention's per-head products); offload: those
    same outputs moved to host memory in the forward pass and back for the backward."""
    policies = jax.checkpoint_policies
    return {
        "none": None,
        "full": None,
        "dots_saveable": policies.dots_saveable,
        "dots_with_no_batch_dims_saveable": policies.dots_with_no_batch_dims_saveable,
        "offload": policies.offload_dot_with_no_batch_dims("device", "pinned_host"),
    }[name]


def _defaults(tokens_BxL, positions, segment_ids):
    """Positions 0..L-1 and one segment per row unless given."""
    if positions is None:
        positions = jnp.broadcast_to(jnp.arange(tokens_BxL.shape[1], dtype=jnp.int32), tokens_BxL.shape)
    if segment_ids is None:
        segment_ids = jnp.ones(tokens_BxL.shape, jnp.int32)
    return positions, segment_ids


class DecoderLM(nn.Module):
    """Decoder-only LM: tokens [B, L] -> logits [B, L, vocab] (float32), causal within each segment."""

    cfg: ModelConfig
    sow_weights: bool = False  # sow attention weights into 'intermediates'

    @nn.compact
    def __call__(
        self, tokens_BxL, positions=None, segment_ids=None, *, deterministic=True, decode=False, mask=None, scored=None
    ):
        """mask bool [B, 1, L, L]: where each token may attend (in place of the segments'; the causal order of the
        positions is added either way); scored [B, C]: the indices into L whose logits are computed ([B, C, V])."""
        cfg = self.cfg
        pos_BxL, seg_BxL = _defaults(tokens_BxL, positions, segment_ids)
        embedder = Embedder(cfg, name="embed")
        x_BxLxD = nn.Dropout(cfg.dropout)(embedder(tokens_BxL, pos_BxL), deterministic=deterministic)
        ctx = {"mask": Segments(seg_BxL, seg_BxL) if mask is None else mask, "pos": pos_BxL}  # + the causal order
        x_BxLxD = Stack(cfg, cfg.num_layers, causal=True, sow_weights=self.sow_weights, name="decoder")(
            x_BxLxD, ctx, deterministic, decode
        )
        if cfg.mtp_depth and not decode and scored is None and self.is_mutable_collection(mtp.MTP):
            depths = mtp.Modules(cfg, deterministic, name="mtp")(x_BxLxD, embedder.token_embedding(tokens_BxL), ctx)
            for normed_BxLxD in depths:  # txjax.model.mtp: only a forward pass that asks for their logits runs them
                self.sow(mtp.MTP, "logits", embedder.logits(normed_BxLxD))
        if decode and self.is_mutable_collection(mtp.MTP):  # the draft of speculative decoding reads h (its h^0)
            self.sow(mtp.MTP, "hidden", x_BxLxD)
        if scored is not None:
            x_BxLxD = jnp.take_along_axis(x_BxLxD, scored[..., None], axis=1)
        return embedder.logits(x_BxLxD)


class EncoderDecoder(nn.Module):
    """Encoder-decoder: encode(src) once, then decode(tgt, encoded) -> logits [B, T, vocab] (float32)."""

    cfg: ModelConfig
    sow_weights: bool = False

    def setup(self):
        cfg = self.cfg
        self.src_embed = Embedder(cfg)
        self.tgt_embed = self.src_embed if cfg.share_embeddings else Embedder(cfg)
        self.dropout = nn.Dropout(cfg.dropout)
        self.encoder = Stack(cfg, cfg.encoder_layers, sow_weights=self.sow_weights)
        self.decoder = Stack(cfg, cfg.num_layers, cross=True, causal=True, sow_weights=self.sow_weights)

    def encode(self, src_BxS, src_positions=None, src_segment_ids=None, *, deterministic=True):
        """Bidirectional self-attention with the source padding (segment) mask: -> [B, S, D]."""
        pos_BxS, seg_BxS = _defaults(src_BxS, src_positions, src_segment_ids)
        x_BxSxD = self.dropout(self.src_embed(src_BxS, pos_BxS), deterministic=deterministic)
        ctx = {"mask": Segments(seg_BxS, seg_BxS), "pos": pos_BxS}
        return self.encoder(x_BxSxD, ctx, deterministic)

    def decode(
        self,
        tgt_BxT,
        encoded_BxSxD,
        src_segment_ids,
        tgt_positions=None,
        tgt_segment_ids=None,
        *,
        deterministic=True,
        decode=False,
    ):
        """Masked self-attention over tgt, cross-attention over `encoded` (padding mask only) -> logits [B,T,V].

        src_segment_ids [B, S]: the source's segments (0 = padding), for the cross-attention mask. In decode mode,
        `encoded_BxSxD=None` reuses the cross-attention keys/values cached by the prefill call.
        """
        pos_BxT, seg_BxT = _defaults(tgt_BxT, tgt_positions, tgt_segment_ids)
        x_BxTxD = self.dropout(self.tgt_embed(tgt_BxT, pos_BxT), deterministic=deterministic)
        ctx = {
            "mask": Segments(seg_BxT, seg_BxT),  # the decoder Stack adds the causal order
            "pos": pos_BxT,
            "enc": encoded_BxSxD,
            "enc_mask": Segments(seg_BxT, src_segment_ids),
        }
        x_BxTxD = self.decoder(x_BxTxD, ctx, deterministic, decode)
        return self.tgt_embed.logits(x_BxTxD)

    def __call__(
        self,
        src_BxS,
        tgt_BxT,
        src_positions=None,
        src_segment_ids=None,
        tgt_positions=None,
        tgt_segment_ids=None,
        *,
        deterministic=True,
    ):
        encoded = self.encode(src_BxS, src_positions, src_segment_ids, deterministic=deterministic)
        if src_segment_ids is None:
            src_segment_ids = jnp.ones(src_BxS.shape, jnp.int32)
        return self.decode(
            tgt_BxT, encoded, src_segment_ids, tgt_positions, tgt_segment_ids, deterministic=deterministic
        )


STACKS = ("dense_layers", "layers")  # the scanned stacks' names (Stack: model.moe_dense_first's, then the rest)


def unstack_layers(tree):
    """Scanned -> looped parameter layout: each {'layers': tree with a leading [num_layers] axis} becomes
    {'layers_0': ..., 'layers_{N-1}': ...} (what scan_layers=False expects). Works on unboxed params or a cache."""
    if not isinstance(tree, Mapping):
        return tree
    out = {}
    for key, sub in tree.items():
        if key in STACKS:
            n = jax.tree_util.tree_leaves(sub)[0].shape[0]
            out.update({f"{key}_{i}": jax.tree_util.tree_map(lambda a, i=i: a[i], sub) for i in range(n)})
        else:
            out[key] = unstack_layers(sub)
    return out


def stack_layers(tree):
    """Looped -> scanned parameter layout, the inverse of `unstack_layers`."""
    if not isinstance(tree, Mapping):
        return tree
    looped = {name: [k for k in tree if re.fullmatch(rf"{name}_\d+", k)] for name in STACKS}
    out = {key: stack_layers(sub) for key, sub in tree.items() if not any(key in keys for keys in looped.values())}
    for name, keys in looped.items():
        if keys:
            keys = sorted(keys, key=lambda k: int(k.rpartition("_")[2]))
            out[name] = jax.tree_util.tree_map(lambda *a: jnp.stack(a), *(tree[k] for k in keys))
    return out
