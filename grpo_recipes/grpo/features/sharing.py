"""share_prompt_forward on the trainer (the math is grpo_recipes/grpo/prompt_sharing.py): `scored_batch` tags each row with
its group, `loss` passes a row's tag on, and `shared_logps`, for the loss's own call only, runs the row against its
group's shared prompt cache."""

from __future__ import annotations

import logging

import torch

from ..prompt_sharing import PromptSharing, blockers
from .base import TrainerFeature

logger = logging.getLogger("grpo_recipes")
PROMPT_GROUP = "prompt_group"  # the batch key that names each row's group


class PromptSharingFeature(TrainerFeature):
    def __init__(self):
        self._sharing: PromptSharing | None = None
        self._group: int | None = None  # the row the loss is computing, read by shared_logps

    @classmethod
    def from_recipe(cls, recipe, training, reward_names):
        return cls() if recipe.share_prompt_forward else None

    def attach(self, trainer) -> bool:
        reasons = blockers(trainer.args, trainer.accelerator.num_processes, trainer.model, trainer.aux_loss_enabled)
        if reasons:
            logger.warning("share_prompt_forward: off in this run: %s", "; ".join(reasons))
            return False
        self._sharing = PromptSharing(trainer.num_generations)
        return True

    def scored_batch(self, trainer, inputs, output: dict) -> dict:
        if trainer.model.training:
            # Rows come in groups of num_generations (TRL's RepeatSampler); the key travels with each row through
            # TRL's shuffle and split into micro-batches.
            self._sharing.new_batch()
            rows, group = len(output["prompt_ids"]), trainer.num_generations
            output[PROMPT_GROUP] = torch.arange(rows // group).repeat_interleave(group)
        return output

    def loss(self, trainer, model, inputs, return_outputs, num_items_in_batch):
        if not trainer.model.training:
            return None
        self._group = int(inputs[PROMPT_GROUP][0])  # read by shared_logps
        loss = trainer.trl_loss(model, inputs, return_outputs, num_items_in_batch)
        if self._group is not None:  # TRL changed its call graph: fail loudly rather than share nothing
            raise RuntimeError("RecipeTrainer: GRPOTrainer's loss no longer asks for the policy's log-probabilities "
                               "(shared_logps); update share_prompt_forward in grpo_recipes/trl_internals.py")
        return loss

    def shared_logps(self, trainer, model, input_ids, attention_mask, logits_to_keep, compute_entropy):
        # Only the loss's own call, with gradients: the reference and old-policy passes (no_grad) stay TRL's.
        group, self._group = self._group, None
        if group is not None and torch.is_grad_enabled():
            with trainer.accelerator.autocast():
                shared = self._sharing.row(model, group, input_ids, attention_mask, logits_to_keep, compute_entropy)
            trainer.metrics("train")["frac_rows_prompt_shared"].append(float(shared is not None))
            if shared is not None:
                return *shared, None
        return None
