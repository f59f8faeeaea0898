"""CpuBudget: charges CPU time inside training steps only, and stops training once the budget is spent."""

from transformers import TrainerControl, TrainerState

from grpo_recipes.state.budget import CpuBudget


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_budget_charges_steps_not_the_work_between_them():
    clock = FakeClock()
    budget = CpuBudget(minutes=1.0, clock=clock)  # 60 CPU-seconds
    state, control = TrainerState(), TrainerControl()
    for step in range(1, 4):
        budget.on_step_begin(None, state, control)
        clock.now += 25.0  # the step: generation, rewards, optimiser
        state.global_step = step
        budget.on_step_end(None, state, control)
        if step < 3:
            assert not control.should_training_stop, step
        clock.now += 100.0  # held-out evaluation / checkpointing between steps: not charged
    assert budget.used_s == 75.0
    assert control.should_training_stop  # 75 s >= 60 s after the third step, not after the first (which 225 s would)


def test_step_end_without_a_begin_charges_nothing():
    clock = FakeClock()
    budget = CpuBudget(minutes=0.01, clock=clock)
    control = TrainerControl()
    clock.now = 1000.0
    budget.on_step_end(None, TrainerState(), control)
    assert budget.used_s == 0.0 and not control.should_training_stop
