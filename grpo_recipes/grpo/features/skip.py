"""skip_zero_advantage_batches: a training micro-batch whose rows all come from equal-reward groups skips its
forward and backward.

A row whose group scored alike has advantage 0 in exact arithmetic; TRL's float32 group mean leaves a rounding
residue (a few ulps / 1e-4, one sign for the whole group) that is noise, not signal. With beta 0 and no entropy bonus
(`skip_blockers`, checked when the trainer is built) every loss type is advantage x (a function of the
log-probabilities), so such a micro-batch's gradient is zero, or that residue's: its forward and backward (three
quarters of a CPU step) are skipped. `per_device_train_batch_size: 1` lets each row skip on its own.
"""

from __future__ import annotations

import logging

from ..groups import equal_reward_groups
from .base import TrainerFeature

logger = logging.getLogger("grpo_recipes")
EQUAL_GROUP = "equal_reward_group"  # the batch key that marks rows to skip


def skip_blockers(args, processes: int, router_loss: bool) -> list[str]:
    """Why skipping the rows of equal-reward groups would not be exact in this run (none: it is)."""
    reasons = []
    if args.beta != 0:
        reasons.append(f"beta {args.beta:g} gives every row a KL gradient")
    if args.entropy_coef != 0 or args.use_adaptive_entropy:
        reasons.append("the entropy bonus (entropy_coef, use_adaptive_entropy) trains every row")
    if args.multi_objective_aggregation != "sum_then_normalize":
        reasons.append(f"multi_objective_aggregation {args.multi_objective_aggregation} normalises over the batch, "
                       "so a group that scored alike still has advantages")
    if router_loss:
        reasons.append("the Mixture-of-Experts router loss trains every row")
    if processes > 1:
        # DDP broadcasts buffers in every forward and all-reduces in the last backward; FSDP and DeepSpeed gather in
        # every forward: a process that skipped alone would leave the others waiting.
        reasons.append(f"{processes} processes would each have to skip the same micro-batches")
    return reasons


class SkipZeroAdvantage(TrainerFeature):
    reads_rewards = True

    @classmethod
    def from_recipe(cls, recipe, training, reward_names):
        return cls() if recipe.skip_zero_advantage_batches else None

    def attach(self, trainer) -> bool:
        blockers = skip_blockers(trainer.args, trainer.accelerator.num_processes, trainer.aux_loss_enabled)
        if blockers:
            logger.warning("skip_zero_advantage_batches: off in this run: %s", "; ".join(blockers))
        return not blockers

    def scored_batch(self, trainer, inputs, output: dict) -> dict:
        rewards_per_func, _ = trainer.captured_rewards()
        if trainer.model.training:
            # One process (skip_blockers), so the gathered rows are this process's rows. A key of the batch:
            # TRL shuffles and splits it into micro-batches with the advantages.
            group = trainer.num_generations
            equal = equal_reward_groups(rewards_per_func, trainer.reward_weights, group)
            output[EQUAL_GROUP] = equal.repeat_interleave(group)
        return output

    def loss(self, trainer, model, inputs, return_outputs, num_items_in_batch):
        if not trainer.model.training:
            return None
        skip = bool(inputs[EQUAL_GROUP].all())
        trainer.metrics("train")["frac_rows_skipped"].append(float(skip))  # micro-batches are equal-sized
        if not skip:
            return None
        # Zero gradients, not none: AdamW passes over a parameter without a gradient, where the full batch would have
        # moved it by its momentum. One pass over the weights, against a forward and backward.
        return sum(p.sum() for p in model.parameters() if p.requires_grad) * 0.0
