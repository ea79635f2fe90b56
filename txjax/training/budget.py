"""WSD sized by a time budget (train.decay_start="budget", train.schedule="wsd", train.max_minutes = M): the decay
starts when (1 - decay_fraction) of the budget's B = 60 M training seconds have passed and runs over as many steps
as the rest of the budget holds at the measured step rate; the run ends where the decay ends. So the budget is used
whole, with the learning rate decayed, on a fast machine as on a slow one (a schedule sized in steps either ends
early or is cut by the budget before it decayed).

After each step s, with t_s the training seconds so far (evals and saves not counted; carried across resumes) and
r the seconds per step measured in this process (its first step, which compiles, left out), the first s with
t_s >= (1 - f) B fixes
    D = s,   n = max(1, min(round((B - t_s) / r), S - s))          S = train.steps: the most steps the run takes
and the learning rate is lr through step D, then falls linearly to min_lr_ratio lr at D + n, the run's last step
(optim.learning_rate_at). Until then the plan is the WSD sized by S (D = S - f (S - w), n = S - D), which the
run follows if its steps run out before the budget (S set too small for the machine).
The plan (D, n) and the clock t_s live in the optimizer state's injected hyperparameters (optim.BUDGET_PLAN), so
every checkpoint holds them: a run resumed after the decay started takes the learning rates of a run never stopped
and ends at its step; one resumed before goes on counting from the checkpoint's t_s. The decision is a wall-clock
one: with several processes, process 0 makes it at the log steps (where txjax.ops.preemption combines its flags) and
broadcasts it, so every process changes the plan at the same step. Stacked runs share the loop, its clock and plan.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.experimental import multihost_utils

from txjax.sections.train import TrainConfig
from txjax.state.optim import BUDGET_PLAN
from txjax.state.train_state import with_hyperparams


class BudgetPlan:
    """The training loop's side of the schedule: when the decay starts, and the step at which the run ends."""

    def __init__(self, t: TrainConfig, saved: dict, start: int):
        """saved: the state's plan (`read`); start: the step this process starts from."""
        self.budget_s, self.fraction, self.steps = 60.0 * t.max_minutes, t.optim.decay_fraction, t.steps
        self.decay_from, self.decay_steps, self.carried_s = (saved[k] for k in BUDGET_PLAN)
        self.start, self.first_s = start, None  # first_s: training seconds after this process's first (compiling) step

    @property
    def end(self) -> int:
        """The run's last step: where the decay ends (at most train.steps)."""
        return min(self.steps, int(np.ceil(self.decay_from + self.decay_steps)))

    def spent_s(self, trained_s: float) -> float:
        """The budget's seconds spent: the checkpoint's clock plus this process's training seconds."""
        return self.carried_s + trained_s

    def update(self, step: int, trained_s: float, sync: bool) -> bool:
        """After `step` (trained_s: this process's training seconds): whether the decay starts now, its plan then in
        decay_from and decay_steps. Several processes decide only when `sync` (the same steps in all)."""
        self.first_s = trained_s if self.first_s is None else self.first_s
        if step >= self.decay_from:  # decaying already (the same plan in every process)
            return False
        spent = self.spent_s(trained_s)
        due = spent >= (1.0 - self.fraction) * self.budget_s
        rate = (trained_s - self.first_s) / (step - self.start - 1) if step > self.start + 1 else trained_s
        n = max(1, min(round((self.budget_s - spent) / max(rate, 1e-9)), self.steps - step))
        if jax.process_count() > 1:
            if not sync:
                return False
            due, n = (int(v) for v in multihost_utils.broadcast_one_to_all(np.array([due, n], np.int32)))
        if due:
            self.decay_from, self.decay_steps = step, n
        return bool(due)


def read(state) -> dict:
    """The plan in a (possibly stacked, possibly multi-process) TrainState: {name: float} (optim.BUDGET_PLAN)."""
    h = state.opt_state.hyperparams
    return {k: float(np.asarray(h[k].addressable_data(0)).reshape(-1)[0]) for k in BUDGET_PLAN}


def record(state, plan: BudgetPlan, trained_s: float):
    """The state with the plan and the clock written into its hyperparameters (every stacked run's)."""
    values = (plan.decay_from, plan.decay_steps, plan.spent_s(trained_s))
    return with_hyperparams(state, dict(zip(BUDGET_PLAN, values)))
