"""Per-generation-batch diagnostics (recipe `diagnostics`; the math is grpo_recipes/grpo/diagnostics.py).

How the numbers are captured, without an extra forward pass: RecipeTrainer keeps TRL's own reward step's result,
already gathered over all processes, with the completion lengths (gathered the same way, so rows line up);
`scored_batch` receives this process's slice of the advantages TRL computed, and gathering them gives the whole
batch in the same row order as the rewards (TRL itself slices by process index). The diagnostics are appended to
`metrics(mode)`, next to TRL's `reward` and `frac_reward_zero_std`, so TRL's `log()` averages them over the logging
window and every `report_to` backend receives them.

A generation batch can serve several optimiser steps (steps_per_generation, num_iterations): its diagnostics are
recorded once, when it is generated, exactly like TRL's reward metrics, and appear in the next log.
"""

from __future__ import annotations

from ..diagnostics import DiagnosticsSpec, batch_diagnostics, correctness_index
from .base import TrainerFeature


class Diagnostics(TrainerFeature):
    reads_rewards = reads_lengths = True

    def __init__(self, spec: DiagnosticsSpec):
        self.spec = spec

    @classmethod
    def from_recipe(cls, recipe, training, reward_names):
        if not recipe.diagnostics:
            return None
        names = tuple(reward_names)
        return cls(DiagnosticsSpec(
            reward_names=names,
            correctness_index=correctness_index(names, recipe.correctness_reward),
            threshold=recipe.correctness_threshold,
            k=recipe.eval_k or training.num_generations,
            normalised=training.scale_rewards != "none",
        ))

    def scored_batch(self, trainer, inputs, output: dict) -> dict:
        rewards_per_func, lengths = trainer.captured_rewards()
        mode = "train" if trainer.model.training else "eval"
        group = trainer.num_generations if mode == "train" else trainer.num_generations_eval
        advantages = trainer.accelerator.gather(output["advantages"].detach())
        metrics = batch_diagnostics(rewards_per_func, trainer.reward_weights, advantages, lengths, group, self.spec)
        for name, value in metrics.items():
            trainer.metrics(mode)[name].append(value)
        return output
