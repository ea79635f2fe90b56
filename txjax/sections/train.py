"""config.train's schema and frozen value: TrainConfig, made once from the validated section at the edge of training
(txjax.training.edge.RunSpec) and handed down to the loop, the train step and the time budget in place of the
ConfigDict. The optimizer's part is its own value, txjax.state.optim.OptimConfig, which is all make_optimizer reads,
and LoRA's is txjax.state.lora.LoraConfig; config.train holds the fields of all three.
"""

from __future__ import annotations

import dataclasses

from txjax.fields import Range, ReadBy, at_least, setting, within
from txjax.state.lora import LoraConfig
from txjax.state.optim import OptimConfig

SEED_MAX = 2**63 - 1  # a seed becomes an int64 (jax.random.key, numpy's generators)
_OFF = Range(lambda v: v >= 0, ">= 0 (0 = off)")
_MOE = ReadBy("model.num_experts", lambda n: n > 0, "a dense model has no router")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """config.train (README.md, "Experiments"): what batch k is, the objective, when to log, evaluate and save."""

    batch_size: int = setting(32, bounds=at_least(1), resume=False)  # examples a step, in grad_accum micro-batches
    grad_accum: int = setting(1, bounds=at_least(1), resume=False)
    seed: int = setting(0, bounds=within(0, SEED_MAX), resume=False)  # parameters, batch order and dropout
    label_smoothing: float = setting(0.0, bounds=within(0, 1, open_hi=True))
    z_loss: float = setting(0.0, bounds=_OFF)  # coefficient of logsumexp(z)^2 in the objective (PaLM's 1e-4)
    # mixture of experts (txjax.model.moe): the balance loss's weight (Switch's 0.01), the router z-loss's (ST-MoE's
    # 1e-3), DeepSeek-V3's bias balancing step (its 1e-3; router 'sigmoid')
    moe_aux_weight: float = setting(0.01, bounds=_OFF, read_by=(_MOE,))
    moe_z_weight: float = setting(0.0, bounds=_OFF, read_by=(_MOE,))
    moe_bias_rate: float = setting(
        0.0, bounds=_OFF, read_by=(_MOE, ReadBy("model.router", ("sigmoid",), "only the sigmoid router has a bias"))
    )
    # multi-token prediction (txjax.model.mtp): the weight of its depths' mean loss (DeepSeek-V3's 0.3, then 0.1)
    mtp_weight: float = setting(0.3, bounds=_OFF, read_by=(ReadBy("model.mtp_depth", lambda d: d > 0, "no MTP"),))
    log_every: int = setting(50, bounds=at_least(1))
    eval_every: int = setting(500, bounds=Range(lambda v: v >= 0, ">= 0 (0 = only at the end)"))
    # batches of the valid split per periodic eval; the final eval reads it all
    eval_batches: int = setting(20, bounds=Range(lambda v: v >= 0, ">= 0 (0 = the whole valid split)"))
    checkpoint_every: int = setting(500, bounds=at_least(1))
    keep_checkpoints: int = setting(3, bounds=at_least(1))
    # training-time budget (evals and saves not counted); stops cleanly: checkpoint + final eval
    max_minutes: float = setting(0.0, bounds=Range(lambda v: v >= 0, ">= 0 (0 = no budget)"))
    # also evaluate every this many minutes of training time
    eval_every_minutes: float = setting(0.0, bounds=Range(lambda v: v >= 0, ">= 0 (0 = by steps only)"))
    profile_steps: str = setting("")  # "A:B": a jax.profiler trace of steps A+1..B in WORKDIR/profile
    eval_generation: bool = setting(False)  # evals also decode the valid split: BLEU/chrF (greedy) or exact match
    # a workdir (run.py import) whose parameters, model and tokenizer start this run
    init_from: str = setting("", resume=False)
    # where the records of metrics.jsonl also go: + wandb | mlflow (txjax.ops.trackers); jsonl always
    trackers: tuple[str, ...] = setting(("jsonl", "tensorboard"))
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)  # config.train's other fields
    lora: LoraConfig = dataclasses.field(default_factory=LoraConfig)  # and its LoRA settings

    @classmethod
    def of(cls, t) -> TrainConfig:
        """From a validated config.train section."""
        names = [f.name for f in dataclasses.fields(cls) if f.name not in ("optim", "lora", "trackers")]
        nested = {"optim": OptimConfig.of(t), "lora": LoraConfig.of(t)}
        return cls(**{name: t[name] for name in names}, trackers=tuple(t.trackers), **nested)

    @property
    def steps(self) -> int:
        """Optimizer steps; with the budget's decay (optim.decay_start="budget") the most it may take."""
        return self.optim.steps

    @property
    def budget_decay(self) -> bool:
        """Whether the time budget sizes the WSD decay and ends the run (txjax.training.budget)."""
        return self.optim.decay_start == "budget"
