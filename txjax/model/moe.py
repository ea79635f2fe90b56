"""Mixture of experts: a router sends each token to k of X expert FFNs; shared experts see every token.

    z = x W_r (+ b_r)                              router logits, float32, W_r [D, X]; b_r with model.moe_bias
    'topk_then_softmax' (Mixtral):                 (v, e) = top_k(z);        g = softmax(v)
    'softmax_then_topk' (Switch, Qwen-MoE, OLMoE): p = softmax(z);           (g, e) = top_k(p)
    'sigmoid' (DeepSeek-V3):                       s = sigmoid(z);           e = top_k(s + b);  g = s_e
                                                   b: a per-expert bias that only selects (no gradient); with
                                                   model.moe_groups = G > 1 the experts are G groups and e is the
                                                   top-k of the moe_topk_groups groups whose two best s + b sum most
    g <- g / sum_j g_j with model.moe_norm_topk (the last two routers);  g <- r g, r = model.moe_routed_scale
    y = sum_j g_j FFN_{e_j}(x) + FFN_shared(x)     FFN_i(x) = act(x W1_i) W2_i, or (silu(x W1_i) * x W3_i) W2_i;
                                                   with model.moe_bias each product + its expert's bias (GPT-OSS)
    model.moe_gate_input (Llama 4):                y = sum_j FFN_{e_j}(g_j x) + FFN_shared(x)
top_k breaks ties toward the lower expert index (jax.lax.top_k). The shared experts are one FeedForward of width
num_shared_experts x moe_d_ff (DeepSeek-MoE); with model.shared_expert_gate its output is scaled per token by
sigmoid(x w_s), w_s [D, 1] (Qwen2-MoE's shared_expert_gate).

Dropless (moe_capacity_factor = 0): the M k (token, expert) assignments are sorted by expert and each expert weight
is one grouped matmul over them (`grouping`, the group sizes = assignments per expert): no loop over experts,
no one-hot product over all of them, no token dropped. On GPU and TPU that is jax.lax.ragged_dot; on XLA:CPU
ragged_dot lowers to a dense product over every expert (jax's ragged_to_dense: X times the FLOPs), so there each
group is padded to whole blocks of rows and the blocks multiply their expert's weight in one batched product
(`blocked`; MegaBlocks' block-sparse layout, Gale et al. 2023).
Capacity (c > 0; GShard, Lepikhin et al. 2021; Switch, Fedus et al. 2022): expert i takes at most
C = ceil(c M k / X) assignments of the M tokens of a call, first choices before second ones, each in token order;
the overflow is dropped (adds nothing: the residual carries the token) and counted. The kept assignments go through
the same grouped matmul (its static [M k, D] shape is the fixed buffer), the dropped ones sorted past its groups.

Per MoE layer, sown into the MOE_STATS collection for the objective and the evals (every position counts):
    expert_tokens n_i    assignments routed to expert i (before any drop);   dropped: assignments dropped
    balance_loss         X sum_i f_i P_i,  f_i = n_i / (M k),  P_i = mean_t p_ti  (Switch eq. 4 with k choices: 1 when
                         balanced; HF's Mixtral loss is k times it); p = softmax(z), or s / sum_i s_i for 'sigmoid'
    z_loss               mean_t logsumexp(z_t)^2   (ST-MoE, Zoph et al. 2022, eq. 5)
The objective adds train.moe_aux_weight * balance_loss + train.moe_z_weight * z_loss of every MoE layer
(`aux_loss`); train.moe_bias_rate = gamma > 0 balances the sigmoid router's bias without a loss after each step,
b_i += gamma sign(mean_j n_j - n_i) (DeepSeek-V3 sec. 2.1.2; `balance_biases`).

Expert parallelism (mesh.expert = E > 1; `across_devices`): each device routes its own rows, and the grouped matmul
above runs on the devices holding each assignment's expert, the rows exchanged by jax.shard_map +
jax.lax.all_to_all (txjax.parallel.expert_parallel says why not sharding annotations: XLA's partitioner all-gathers
every row for the global sort instead of exchanging them).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from txjax.model import precision as precision_lib
from txjax.model import roles
from txjax.model.activations import GATED, hidden_units
from txjax.model.config import ModelConfig
from txjax.model.ffn import FeedForward, dense
from txjax.parallel import expert_parallel
from txjax.parallel.sharding import EXPERT_AXIS, context_axis

MOE_STATS = "moe"  # the collection of each MoE layer's routing statistics and auxiliary losses
_OVERWRITE = dict(init_fn=lambda: jnp.zeros(()), reduce_fn=lambda _, value: value)  # sow one value, not a tuple


def route(z_MxX, router: str, k: int, norm_topk: bool = False, bias_X=None, groups=(1, 1), scale: float = 1.0):
    """(gates f32[M, J], experts i32[M, J], probabilities f32[M, X]) of router logits, by the equations above; the
    probabilities are what the balance loss averages. groups: (G, the groups kept) of the sigmoid router."""
    if router == "topk_then_softmax":
        top_MxJ, experts_MxJ = jax.lax.top_k(z_MxX, k)
        return jax.nn.softmax(top_MxJ, axis=-1), experts_MxJ, jax.nn.softmax(z_MxX, axis=-1)
    if router == "softmax_then_topk":
        probs_MxX = jax.nn.softmax(z_MxX, axis=-1)
        gates_MxJ, experts_MxJ = jax.lax.top_k(probs_MxX, k)
    else:  # sigmoid: the bias chooses, the scores weigh
        scores_MxX = jax.nn.sigmoid(z_MxX)
        probs_MxX = scores_MxX / scores_MxX.sum(-1, keepdims=True)
        _, experts_MxJ = jax.lax.top_k(limit_groups(scores_MxX + jax.lax.stop_gradient(bias_X), *groups), k)
        gates_MxJ = jnp.take_along_axis(scores_MxX, experts_MxJ, axis=-1)
    if norm_topk:
        gates_MxJ = gates_MxJ / gates_MxJ.sum(-1, keepdims=True)
    return gates_MxJ * scale, experts_MxJ, probs_MxX


def limit_groups(choice_MxX, groups: int, kept: int):
    """DeepSeek-V3's group-limited choice: the experts as `groups` equal groups, each ranked by the sum of its two
    best scores, those outside the `kept` best groups set to -inf (the choice as it is for one group)."""
    if groups == 1:
        return choice_MxX
    by_group = choice_MxX.reshape(*choice_MxX.shape[:-1], groups, -1)
    _, best_MxK = jax.lax.top_k(jax.lax.top_k(by_group, 2)[0].sum(-1), kept)
    chosen_MxG = jax.nn.one_hot(best_MxK, groups, dtype=bool).any(-2)
    return jnp.where(chosen_MxG[..., None], by_group, -jnp.inf).reshape(choice_MxX.shape)


def plan(experts_MxJ, num_experts: int, capacity: int | None = None):
    """The grouped matmul's plan for the assignments a = j M + t (choice-major: first choices first):
    (order [MJ]: the assignments sorted by expert, dropped ones last; group sizes [X]: kept assignments per expert;
    keep bool[MJ]; counts [X]: assignments routed to each expert). capacity C: each expert keeps its first C
    assignments in that order (None: all)."""
    experts_A = experts_MxJ.T.reshape(-1)
    counts_X = jnp.bincount(experts_A, length=num_experts)
    if capacity is None:
        return jnp.argsort(experts_A, stable=True), counts_X, jnp.ones(experts_A.shape, bool), counts_X
    by_expert_A = jnp.argsort(experts_A, stable=True)
    starts_X = jnp.cumsum(counts_X) - counts_X
    place_sorted_A = jnp.arange(experts_A.size) - starts_X[experts_A[by_expert_A]]  # place in its expert's queue
    keep_A = jnp.zeros(experts_A.shape, bool).at[by_expert_A].set(place_sorted_A < capacity)
    order_A = jnp.argsort(jnp.where(keep_A, experts_A, num_experts), stable=True)
    return order_A, jnp.minimum(counts_X, capacity), keep_A, counts_X


@jax.custom_vjp
def take_rows(x_RxI, index_P, inverse_R):
    """x[index] (rows of out-of-range indices 0), where `index` is one-to-one onto the rows it takes and `inverse`
    maps each row of x back to its place in the result (out of range: taken by none). Its gradient is the same
    gather by `inverse`, not the scatter-add jax derives for a general gather (a serial loop on XLA:CPU)."""
    return x_RxI.at[index_P].get(mode="fill", fill_value=0)


def _take_rows_fwd(x_RxI, index_P, inverse_R):
    return take_rows(x_RxI, index_P, inverse_R), (index_P, inverse_R)


def _take_rows_bwd(saved, g_PxI):
    index_P, inverse_R = saved
    return g_PxI.at[inverse_R].get(mode="fill", fill_value=0), None, None


take_rows.defvjp(_take_rows_fwd, _take_rows_bwd)


def grouping(group_sizes_X, rows: int):
    """The grouped matmul for `rows` rows sorted by group (group g: group_sizes[g] of them; rows past their sum give
    0), as three steps, so that a chain of products (an expert FFN) enters and leaves the grouped form once:
    (enter(rows [A, I]) -> grouped form, product(grouped, w [X, I, O]) -> grouped form of (row of group g) w[g],
    leave(grouped) -> [A, O]); products in the rows' dtype (the weights cast to it) with float32 sums; product's
    optional bias [X, O] adds each row's group's row of it (rows past the groups get 0 or a bias: callers mask them).
    jax.lax.ragged_dot, or `blocked` on XLA:CPU (see the module docstring) with blocks of a power of two near half a
    group's mean size (XLA:CPU's batched product runs small blocks slowly, large ones waste more padding)."""
    x = group_sizes_X.shape[0]
    if jax.default_backend() == "cpu":
        return blocked(group_sizes_X, rows, max(8, 2 ** int(math.log2(max(rows // (2 * x), 1)))))

    def product(h_AxI, w_XxIxO, bias_XxO=None):
        out = jax.lax.ragged_dot(h_AxI, w_XxIxO.astype(h_AxI.dtype), group_sizes_X, preferred_element_type=jnp.float32)
        if bias_XxO is not None:
            group_A = jnp.searchsorted(jnp.cumsum(group_sizes_X), jnp.arange(rows), side="right")  # x: past them
            out = out + bias_XxO.at[group_A].get(mode="fill", fill_value=0)
        return out.astype(h_AxI.dtype)

    return (lambda rows_AxI: rows_AxI), product, (lambda out_AxO: out_AxO)


def blocked(group_sizes_X, rows: int, block: int):
    """`grouping` by blocks: each group padded to whole blocks of `block` rows (the padded layout holds at most
    A + X (block - 1) rows, its static size), each block multiplied by its group's weight in one batched product over
    the blocks (the weights picked per block by a one-hot product, whose gradient is a product too, not a scatter).
    FLOPs: (A + X block) I O, plus blocks x X x I x O to pick the weights."""
    a, x = rows, group_sizes_X.shape[0]
    blocks = -(-(a + x * (block - 1)) // block)
    ends_X = jnp.cumsum(group_sizes_X)
    padded_X = -(-group_sizes_X // block) * block
    padded_ends_X = jnp.cumsum(padded_X)
    group_A = jnp.searchsorted(ends_X, jnp.arange(a), side="right")  # x: past the groups
    g_A = jnp.minimum(group_A, x - 1)
    slot_A = padded_ends_X[g_A] - padded_X[g_A] + jnp.arange(a) - (ends_X - group_sizes_X)[g_A]
    slot_A = jnp.where(group_A < x, slot_A, blocks * block)  # out of range: no slot
    row_P = jnp.full(blocks * block, a).at[slot_A].set(jnp.arange(a), mode="drop")  # a: padding
    pick_NxX = jax.nn.one_hot(
        jnp.minimum(jnp.searchsorted(padded_ends_X, jnp.arange(blocks) * block, side="right"), x - 1), x
    )

    def product(h_NxBxI, w_XxIxO, bias_XxO=None):
        w_NxIxO = jnp.einsum("nx,xio->nio", pick_NxX.astype(w_XxIxO.dtype), w_XxIxO).astype(h_NxBxI.dtype)
        out = precision_lib.einsum("nbi,nio->nbo", h_NxBxI, w_NxIxO)
        if bias_XxO is None:
            return out
        return out + jnp.einsum("nx,xo->no", pick_NxX, bias_XxO)[:, None, :].astype(out.dtype)

    enter = lambda rows_AxI: take_rows(rows_AxI, row_P, slot_A).reshape(blocks, block, -1)
    leave = lambda out_NxBxO: take_rows(out_NxBxO.reshape(blocks * block, -1), slot_A, row_P)
    return enter, product, leave


def sorted_apply(fn, x_AxI, order_A, sizes_X):
    """fn(the rows sorted by `order`, group sizes) -> outputs in that order, returned in the rows' own order."""
    rank_A = jnp.zeros_like(order_A).at[order_A].set(jnp.arange(order_A.size))  # the inverse permutation
    return take_rows(fn(take_rows(x_AxI, order_A, rank_A), sizes_X), rank_A, order_A)


def across_devices(cfg: ModelConfig, weights, x_BxLxD, experts_MxJ, keep_A):
    """The expert outputs [J, M, D] of the assignments (token t's j-th choice; dropped ones 0) under expert
    parallelism: each device sorts its own tokens' kept assignments by expert and exchanges them with the devices
    holding those experts (txjax.parallel.expert_parallel), `weights` (Experts' parameters) split along the expert
    axis."""
    (b, l, d), (m, k), x = x_BxLxD.shape, experts_MxJ.shape, cfg.num_experts
    group_BxLxJ = jnp.where(keep_A.reshape(k, m).T, experts_MxJ, x).reshape(b, l, k)  # dropped: expert x (none)

    def body(local_weights, x_bxlxD, group_bxlxJ):
        # this device's experts (top-k set to 1: ModelConfig checks k <= experts, and Experts does not read it)
        local = dataclasses.replace(cfg, num_experts=x // context_axis(EXPERT_AXIS), experts_per_token=1)
        ffn = lambda rows_RxD, sizes_L: Experts(local).apply({"params": local_weights}, rows_RxD, sizes_L)

        def local_experts(rows_RxD, expert_R):
            order_R, sizes_L, _, _ = plan(expert_R[:, None], local.num_experts)
            return sorted_apply(ffn, rows_RxD, order_R, sizes_L)

        group_mxJ = group_bxlxJ.reshape(-1, k)
        order_a, sizes_X, _, _ = plan(group_mxJ, x)  # dropped assignments (expert x) sorted past every group
        x_aD = jnp.tile(x_bxlxD.reshape(-1, d).astype(cfg.compute_dtype), (k, 1))
        y_aD = sorted_apply(
            lambda rows, sizes: expert_parallel.exchange(local_experts, rows, sizes), x_aD, order_a, sizes_X
        )
        return y_aD.reshape(k, *x_bxlxD.shape)

    return expert_parallel.on_expert_shards(body, weights, x_BxLxD, group_BxLxJ).reshape(k, m, d)


class Experts(nn.Module):
    """X expert FFNs as stacked weights, wi (and wi_gate) [X, D, F], wo [X, F, D] (with model.moe_bias their biases
    wi_bias, wi_gate_bias [X, F], wo_bias [X, D]), applied to rows sorted by expert: one grouped matmul per weight
    (rows past the groups' sum come out 0, or as a bias: the caller masks them)."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x_AxD, group_sizes_X):
        cfg = self.cfg
        experts, f, d = cfg.num_experts, cfg.expert_d_ff, x_AxD.shape[-1]

        def weight(name, shape, axes, std):
            init = roles.init(nn.initializers.normal(std), axes, roles.MATRIX)
            return self.param(name, init, shape, jnp.float32)

        def bias(name, width, axis):
            init = roles.init(nn.initializers.zeros, ("expert", axis), roles.BIAS)
            return self.param(f"{name}_bias", init, (experts, width), jnp.float32) if cfg.moe_bias else None

        enter, product, leave = grouping(group_sizes_X, x_AxD.shape[0])
        x_grouped = enter(x_AxD.astype(cfg.compute_dtype))
        w_in = lambda name: product(
            x_grouped,
            weight(name, (experts, d, f), ("expert", "embed", "mlp"), cfg.hidden_init_std),
            bias(name, f, "mlp"),
        )
        h_grouped = hidden_units(cfg.activation, w_in("wi"), w_in("wi_gate") if cfg.activation in GATED else None)
        w_out = weight("wo", (experts, f, d), ("expert", "mlp", "embed"), cfg.out_init_std)
        return leave(product(h_grouped, w_out, bias("wo", d, "embed")))


class MoE(nn.Module):
    """The mixture-of-experts FFN of the module docstring: [B, L, D] -> float32 [B, L, D]; its routing statistics
    and auxiliary losses sown into MOE_STATS (kept where the caller makes that collection mutable)."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x_BxLxD):
        cfg = self.cfg
        num_experts, k = cfg.num_experts, cfg.experts_per_token
        x_MxD = x_BxLxD.reshape(-1, x_BxLxD.shape[-1])
        m = x_MxD.shape[0]
        router = dense(num_experts, ("embed", None), cfg.moe_bias, jnp.float32, cfg.hidden_init_std, name="router")
        # the dense layers read [B, L, D], the rank decoding's out-major kernels take (txjax.decode.kernels)
        z_MxX = router(x_BxLxD.astype(jnp.float32)).reshape(m, num_experts)
        bias_X = None
        if cfg.router == "sigmoid":
            init = roles.init(nn.initializers.zeros, (None,), roles.BIAS)
            bias_X = self.param("router_bias", init, (num_experts,), jnp.float32)
        groups, scale = (cfg.moe_groups, cfg.moe_topk_groups), cfg.moe_routed_scale
        gates_MxJ, experts_MxJ, probs_MxX = route(z_MxX, cfg.router, k, cfg.moe_norm_topk, bias_X, groups, scale)
        capacity = math.ceil(cfg.moe_capacity_factor * m * k / num_experts) if cfg.moe_capacity_factor else None
        order_A, sizes_X, keep_A, counts_X = plan(experts_MxJ, num_experts, capacity)
        experts = Experts(cfg, name="experts")
        if expert_parallel.applies(x_BxLxD.shape, num_experts) and not self.is_initializing():
            y_JxMxD = across_devices(cfg, self.variables["params"]["experts"], x_BxLxD, experts_MxJ, keep_A)
        else:
            x_AxD = jnp.tile(x_MxD, (k, 1))  # a = j M + t: token t's j-th copy
            if cfg.moe_gate_input:  # Llama 4: FFN_e(g x)
                x_AxD = x_AxD * gates_MxJ.T.reshape(-1, 1)
            y_JxMxD = sorted_apply(experts, x_AxD.astype(cfg.compute_dtype), order_A, sizes_X).reshape(k, m, -1)
        y_JxMxD = jnp.where(keep_A.reshape(k, m, 1), y_JxMxD.astype(jnp.float32), 0.0)
        y_MxD = (y_JxMxD if cfg.moe_gate_input else gates_MxJ.T[..., None] * y_JxMxD).sum(0)
        if cfg.num_shared_experts:
            shared = FeedForward(cfg, width=cfg.num_shared_experts * cfg.expert_d_ff, name="shared_experts")
            shared_MxD = shared(x_BxLxD).astype(jnp.float32).reshape(m, -1)
            if cfg.shared_expert_gate:
                gate = dense(1, ("embed", None), False, jnp.float32, cfg.hidden_init_std, name="shared_expert_gate")
                shared_MxD = jax.nn.sigmoid(gate(x_BxLxD.astype(jnp.float32)).reshape(m, 1)) * shared_MxD
            y_MxD = y_MxD + shared_MxD

        fraction_X = counts_X / (m * k)
        self.sow(MOE_STATS, "expert_tokens", counts_X.astype(jnp.float32), **_OVERWRITE)
        self.sow(MOE_STATS, "dropped", (m * k - keep_A.sum()).astype(jnp.float32), **_OVERWRITE)
        self.sow(MOE_STATS, "balance_loss", num_experts * jnp.sum(fraction_X * probs_MxX.mean(0)), **_OVERWRITE)
        self.sow(MOE_STATS, "z_loss", jnp.mean(jnp.square(jax.nn.logsumexp(z_MxX, axis=-1))), **_OVERWRITE)
        return y_MxD.reshape(x_BxLxD.shape)


# ----------------------------------------------------------------------------------------------------------------
# The statistics' uses: the objective's auxiliary losses, the bias balancing, the eval metrics


def _sown(stats, name: str) -> list:
    """Every MoE layer's `name` in a MOE_STATS tree (scanned layers: a leading layer axis)."""
    return [v for path, v in traverse_util.flatten_dict(dict(stats)).items() if path[-1] == name]


def aux_loss(stats, aux_weight: float, z_weight: float):
    """aux_weight * sum of the layers' balance losses + z_weight * sum of their z-losses (0.0 for a dense model)."""
    total = 0.0
    for name, weight in (("balance_loss", aux_weight), ("z_loss", z_weight)):
        if weight:
            total = total + weight * sum(jnp.sum(v) for v in _sown(stats, name))
    return total


def balance_biases(params, stats, rate: float):
    """DeepSeek-V3's aux-loss-free balancing: each sigmoid router's bias b_i += rate sign(mean_j n_j - n_i), n the
    step's expert_tokens of that layer (found at the parameter's own path in `stats`)."""
    if not isinstance(params, Mapping):
        return params
    out = {key: balance_biases(sub, stats.get(key, {}), rate) for key, sub in params.items()}
    if "router_bias" in params and "expert_tokens" in stats:
        n = stats["expert_tokens"]
        out["router_bias"] = params["router_bias"] + rate * jnp.sign(n.mean(-1, keepdims=True) - n)
    return type(params)(out)


def eval_sums(stats) -> dict:
    """One eval batch's MoE sums ({} for a dense model): tokens routed per (layer, expert) [N, X], assignments dropped,
    and the balance and z losses summed over the layers."""
    tokens = _sown(stats, "expert_tokens")
    if not tokens:
        return {}
    return {
        "moe_expert_tokens": jnp.concatenate([t.reshape(-1, t.shape[-1]) for t in tokens]),
        "moe_dropped": sum(jnp.sum(v) for v in _sown(stats, "dropped")),
        "moe_balance_loss": sum(jnp.sum(v) for v in _sown(stats, "balance_loss")),
        "moe_z_loss": sum(jnp.sum(v) for v in _sown(stats, "z_loss")),
    }


def eval_metrics(total: dict, batches: int) -> dict:
    """Metrics of eval_sums added over `batches` batches: the least and most loaded expert's share of its layer's
    assignments (1/X each when balanced), the fraction of assignments dropped, the mean balance and z losses of a
    layer."""
    if "moe_expert_tokens" not in total:
        return {}
    tokens_NxX = np.asarray(total["moe_expert_tokens"], np.float64)
    load_NxX = tokens_NxX / np.maximum(tokens_NxX.sum(-1, keepdims=True), 1.0)
    per_layer = max(batches, 1) * tokens_NxX.shape[0]
    return {
        "moe_load_min": float(load_NxX.min()),
        "moe_load_max": float(load_NxX.max()),
        "moe_dropped_fraction": float(total["moe_dropped"]) / max(float(tokens_NxX.sum()), 1.0),
        "moe_balance_loss": float(total["moe_balance_loss"]) / per_layer,
        "moe_z_loss": float(total["moe_z_loss"]) / per_layer,
    }
