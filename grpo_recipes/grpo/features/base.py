"""TrainerFeature: one feature of RecipeTrainer (diagnostics, skip, prompt sharing, demonstrations, tools, sampling).

A feature is declared once, in its own module: which config fields turn it on (`from_recipe`), its start-up checks
(`problems`, `data_problems`), its trainer code (the hooks) and the alerts that watch its metrics (`detectors`). RecipeTrainer calls each hook of every feature in
stages/grpo.py FEATURES' order; every default leaves the batch, the loss and TRL's behaviour as they are. A hook gets the
trainer (trl_internals.HookedGRPOTrainer's public helpers, RecipeTrainer's glue: `captured_rewards`,
`batch_inputs`, `trl_loss`) as its first argument.
"""

from __future__ import annotations

import contextlib


class TrainerFeature:
    reads_rewards = False  # RecipeTrainer keeps the batch's gathered rewards for it (captured_rewards)
    reads_lengths = False  # ... and the completions' lengths, gathered the same way

    # -- declared once: when it is on, what it checks at start-up

    @classmethod
    def from_recipe(cls, recipe, training, reward_names: list[str]) -> TrainerFeature | None:
        """The feature for this recipe and stage config (GRPOConfig), or None when the recipe leaves it off."""
        return None

    @classmethod
    def problems(cls, recipe, training) -> list[str]:
        """Its settings' start-up problems, from the config alone (GRPOStage.problems)."""
        return []

    @classmethod
    def data_problems(cls, recipe, training, train) -> list[str]:
        """Its start-up problems that only the loaded training rows show (GRPOStage.data_problems)."""
        return []

    @classmethod
    def detectors(cls, recipe) -> list:
        """The alerts.Detector instances that watch the metrics it logs, for this recipe (its alert_* thresholds;
        GRPOStage.callbacks)."""
        return []

    # -- on the trainer

    def attach(self, trainer) -> bool:
        """Once the trainer is built: set up what the feature keeps; False leaves it off in this run."""
        return True

    def before_generation(self, trainer, prompts) -> None:
        pass

    def generating(self, trainer):
        """A context manager TRL's generation runs inside (after before_generation)."""
        return contextlib.nullcontext()

    def generated(self, trainer, prompts, output):
        return output

    def scored_rewards(self, trainer, inputs, prompts, completions, completion_ids, rewards) -> None:
        pass

    def scoring_batch(self, trainer, inputs) -> None:
        pass

    def refilled(self, trainer, inputs, output: dict) -> dict:
        return output

    def scored_batch(self, trainer, inputs, output: dict) -> dict:
        return output

    def loss(self, trainer, model, inputs, return_outputs, num_items_in_batch):
        """The micro-batch's loss, or None: the next feature's, or TRL's (trainer.trl_loss)."""
        return None

    def shared_logps(self, trainer, model, input_ids, attention_mask, logits_to_keep, compute_entropy):
        """As HookedGRPOTrainer.shared_logps: None leaves the next feature or TRL to compute them."""
        return None
