"""Stop training after a fixed amount of training CPU time: fair budgets for comparisons on a shared machine."""

from __future__ import annotations

import logging
import time

from transformers import TrainerCallback

logger = logging.getLogger(__name__)


def cpu_seconds() -> float:
    """This process's CPU time: every CPU figure a run records or budgets is read from it (a test puts a clock of its
    own in its place)."""
    return time.process_time()


class StepClock(TrainerCallback):
    """This process's CPU time inside training steps (`used_s`): generation, rewards, loss and optimiser. Held-out
    evaluation, logging and checkpointing run between steps and are not counted. CPU time, unlike wall time, does not
    shrink when other work shares the machine.

    Its on_step_end must run before other callbacks' step-end work (held-out evaluation), so it comes before them in
    the callback list."""

    def __init__(self, clock=None):
        self.clock = clock
        self.used_s = 0.0
        self._step_start = None

    def _now(self) -> float:
        return self.clock() if self.clock is not None else cpu_seconds()

    def on_step_begin(self, args, state, control, **kwargs):
        self._step_start = self._now()

    def on_step_end(self, args, state, control, **kwargs):
        if self._step_start is None:
            return
        self.used_s += self._now() - self._step_start
        self._step_start = None


class CpuBudget(StepClock):
    """Ends training (the normal way: final save and evaluation still run) once this process has spent `minutes` of
    CPU time inside training steps (StepClock), so a run that evaluates more often does not train less, and runs with
    equal budgets did equal work.

    It must come first in the callback list: its on_step_end then closes the step's clock before any other
    callback's work (held-out evaluation) and sets should_training_stop where they can read it."""

    def __init__(self, minutes: float, clock=None):
        super().__init__(clock)
        self.limit_s = 60.0 * minutes

    def on_step_end(self, args, state, control, **kwargs):
        super().on_step_end(args, state, control, **kwargs)
        if self.used_s >= self.limit_s:
            logger.info("CPU budget of %.1f min used at step %d: stopping", self.limit_s / 60, state.global_step)
            control.should_training_stop = True
