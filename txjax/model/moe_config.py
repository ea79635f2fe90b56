"""The mixture-of-experts fields' checks (txjax.model.moe), called from ModelConfig.__post_init__, and which layer
of a stack is MoE: the first moe_dense_first layers dense (DeepSeek-V3's first_k_dense_replace), then from layer k
on every moe_every-th one (layers k + n - 1, k + 2n - 1, ...)."""

from __future__ import annotations

import dataclasses


def is_moe(cfg, i: int) -> bool:
    """Whether layer i of a stack has a mixture of experts for its FFN."""
    j = i - cfg.moe_dense_first
    return cfg.num_experts > 0 and j >= 0 and (j + 1) % cfg.moe_every == 0


def check_moe(cfg) -> None:
    """The mixture-of-experts fields of a ModelConfig: read only with num_experts > 0, and then consistent (a
    ValueError naming the field and the fix)."""
    moe_fields = ("experts_per_token", "num_shared_experts", "moe_d_ff", "moe_every", "router", "moe_norm_topk")
    moe_fields += ("moe_capacity_factor", "shared_expert_gate", "moe_bias", "moe_groups", "moe_topk_groups")
    moe_fields += ("moe_routed_scale", "moe_gate_input", "moe_dense_first")
    if not isinstance(cfg.num_experts, int) or cfg.num_experts < 0:
        raise ValueError(f"model.num_experts={cfg.num_experts!r} must be an integer >= 0 (0 = dense FFN)")
    if cfg.num_experts == 0:
        defaults = {f.name: f.default for f in dataclasses.fields(cfg)}
        if unread := [name for name in moe_fields if getattr(cfg, name) != defaults[name]]:
            back = " ".join(f"model.{name}={defaults[name]}" for name in unread)
            raise ValueError(
                f"model.{' and model.'.join(unread)} {'are' if len(unread) > 1 else 'is'} read only by an MoE "
                f"model: set {back} (the default{'s' * (len(unread) > 1)}) or model.num_experts > 0"
            )
        return
    for name in ("experts_per_token", "moe_every", *(("moe_d_ff",) if cfg.moe_d_ff is not None else ())):
        if not isinstance(getattr(cfg, name), int) or getattr(cfg, name) <= 0:
            raise ValueError(f"model.{name}={getattr(cfg, name)!r} must be a positive integer")
    if not isinstance(cfg.num_shared_experts, int) or cfg.num_shared_experts < 0:
        raise ValueError(f"model.num_shared_experts={cfg.num_shared_experts!r} must be an integer >= 0")
    if cfg.experts_per_token > cfg.num_experts:
        raise ValueError(
            f"model.experts_per_token={cfg.experts_per_token} must be <= model.num_experts={cfg.num_experts}"
        )
    k = cfg.moe_dense_first
    if not isinstance(k, int) or k < 0:
        raise ValueError(f"model.moe_dense_first={k!r} must be an integer >= 0")
    for name, layers in (("num_layers", cfg.num_layers), ("num_encoder_layers", cfg.encoder_layers)):
        if k >= layers:
            raise ValueError(
                f"model.moe_dense_first={k} leaves model.{name}={layers} no MoE layer: set it below {layers}"
            )
        if (layers - k) % cfg.moe_every:
            less = f" - model.moe_dense_first={k}" if k else ""
            raise ValueError(f"model.{name}={layers}{less} must be a multiple of model.moe_every={cfg.moe_every}")
    if k % max(len(cfg.layer_types), 1):  # the dense prefix repeats the linear/full pattern whole (models.Stack)
        raise ValueError(
            f"model.moe_dense_first={k} must be a multiple of len(model.layer_types)={len(cfg.layer_types)}"
        )
    if cfg.moe_capacity_factor < 0:
        raise ValueError(f"model.moe_capacity_factor={cfg.moe_capacity_factor} must be >= 0 (0 = dropless)")
    if cfg.moe_norm_topk and cfg.router == "topk_then_softmax":
        raise ValueError(
            "model.moe_norm_topk: router 'topk_then_softmax' gates already sum to 1: set model.moe_norm_topk=false"
        )
    if cfg.use_bias:
        raise ValueError("model.num_experts > 0 puts its biases by model.moe_bias: set model.use_bias=false")
    if cfg.shared_expert_gate and not cfg.num_shared_experts:
        raise ValueError("model.shared_expert_gate gates the shared experts: set model.num_shared_experts > 0")
    groups, top = cfg.moe_groups, cfg.moe_topk_groups
    if not (isinstance(groups, int) and isinstance(top, int) and groups >= 1):
        raise ValueError(f"model.moe_groups={groups!r} and model.moe_topk_groups={top!r} must be integers >= 1")
    per_group = cfg.num_experts // groups
    if groups > 1 and (cfg.router != "sigmoid" or cfg.num_experts % groups or per_group < 2):
        raise ValueError("model.moe_groups > 1 needs model.router=sigmoid and groups of >= 2 of model.num_experts")
    if not (1 <= top <= groups and cfg.experts_per_token <= top * per_group):
        raise ValueError(f"model.moe_topk_groups={top} must be in [1, model.moe_groups={groups}] and hold top-k")
    if not cfg.moe_routed_scale > 0:
        raise ValueError(f"model.moe_routed_scale={cfg.moe_routed_scale!r} must be > 0")
