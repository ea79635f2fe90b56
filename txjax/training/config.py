"""A run's training settings as one frozen value: TrainConfig, made once from the config's train section after
txjax.config.validate checked it (at the command line, or in the sweep that built the config), at the edge of
training (txjax.training.edge.RunSpec), and handed down to the loop, the train step and the time budget in place of
the ConfigDict. The optimizer's part is its own value, txjax.state.optim.OptimConfig, which is all make_optimizer
reads.
"""

from __future__ import annotations

import dataclasses

from txjax.state.optim import OptimConfig


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """config.train (README.md, "Experiments"): what batch k is, the objective, when to log, evaluate and save."""

    batch_size: int  # examples per optimizer step, split into grad_accum micro-batches
    grad_accum: int
    seed: int  # parameters, batch order and dropout
    label_smoothing: float
    z_loss: float
    moe_aux_weight: float  # mixture of experts (txjax.model.moe): balance loss, router z-loss, bias balancing rate
    moe_z_weight: float
    moe_bias_rate: float
    log_every: int
    eval_every: int  # 0: only at the end
    eval_batches: int
    checkpoint_every: int
    keep_checkpoints: int
    max_minutes: float  # 0: no time budget
    eval_every_minutes: float
    profile_steps: str
    eval_generation: bool
    init_from: str  # a workdir whose parameters start the run ("" for none)
    trackers: tuple[str, ...]  # where the records of metrics.jsonl also go (txjax.ops.trackers)
    optim: OptimConfig

    @classmethod
    def of(cls, t) -> TrainConfig:
        """From a validated config.train section."""
        names = [f.name for f in dataclasses.fields(cls) if f.name not in ("optim", "trackers")]
        return cls(**{name: t[name] for name in names}, trackers=tuple(t.trackers), optim=OptimConfig.of(t))

    @property
    def steps(self) -> int:
        """Optimizer steps; with the budget's decay (optim.decay_start="budget") the most it may take."""
        return self.optim.steps

    @property
    def budget_decay(self) -> bool:
        """Whether the time budget sizes the WSD decay and ends the run (txjax.training.budget)."""
        return self.optim.decay_start == "budget"
