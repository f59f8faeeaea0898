"""Stop training after a fixed amount of process CPU time: fair budgets for comparisons on a shared machine."""

from __future__ import annotations

import logging
import time

from transformers import TrainerCallback

logger = logging.getLogger(__name__)


class CpuBudget(TrainerCallback):
    """Ends training (the normal way: final save and evaluation still run) once this process has used
    `minutes` of CPU time since training began. CPU time, unlike wall time, does not shrink when other
    work shares the machine, so runs with equal budgets did equal work."""

    def __init__(self, minutes: float):
        self.limit_s = 60.0 * minutes
        self.start = None

    def on_step_begin(self, args, state, control, **kwargs):
        if self.start is None:  # from the first step, so the start-of-training evaluation is not charged
            self.start = time.process_time()

    def on_step_end(self, args, state, control, **kwargs):
        used = time.process_time() - self.start
        if used >= self.limit_s:
            logger.info("CPU budget of %.1f min used at step %d: stopping", self.limit_s / 60, state.global_step)
            control.should_training_stop = True
