"""One forward and one backward of a group's prompt for all of its completions (recipe `share_prompt_forward`): the
shared-prompt loss, when it can hold (`blockers`), and its trainer hooks.

A GRPO group is G completions of one prompt, and TRL's loss runs each row as prompt + completion: the prompt's
layers run G times forward and G times backward. In the CPU math default the prompt is 53 of a row's ~70 tokens.
Here the first row of a group to reach the loss runs the prompt (all but its last token) once and keeps the
key/value cache it produces; every row then runs only the prompt's last token and its completion against that cache.

The gradient: a row other than the group's last attends to detached copies of the cache, whose `.grad` collects
what it sends back; the last row attends to the live cache through `_AddGradient`, which adds what the copies
collected, so one backward through the prompt carries the whole group's gradient. The loss, the log-probabilities
and the gradient are TRL's up to float rounding (tests/test_prompt_sharing.py), whatever the order of the rows.
(A model with dropout would draw one dropout mask for the prompt per group instead of one per row.)

It needs all G rows of a group in one optimiser step, one row per micro-batch, one process, and a plain
full-attention cache: `blockers` says what prevents it in a run. The model's cache layers and TRL's fused LM head
(log-probabilities without logits) are reached through trl_internals. On the trainer: `scored_batch` tags each row
with its group, `loss` passes a row's tag on, and `shared_logps`, for the loss's own call only, runs the row against
its group's shared prompt cache."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ...trl_internals import fused_logps_after, non_full_attention_cache, prompt_key_values
from .base import TrainerFeature


def blockers(args, processes: int, model, router_loss: bool) -> list[str]:
    """Why the prompt's forward could not be shared in this run (none: it can)."""
    reasons = []
    if processes > 1:
        # DDP, FSDP and DeepSpeed run their hooks once per forward and backward pair; here one prompt forward feeds
        # several backward passes.
        reasons.append(f"{processes} processes (it needs one: DDP/FSDP/DeepSpeed pair each forward with one backward)")
    if args.per_device_train_batch_size != 1:
        reasons.append("it needs one row per micro-batch (per_device_train_batch_size 1)")
    if args.steps_per_generation != args.gradient_accumulation_steps:
        reasons.append("a group's rows must all fall in one optimiser step (steps_per_generation equal to "
                       "gradient_accumulation_steps)")
    if args.gradient_checkpointing:
        reasons.append("activation checkpointing keeps no key/value cache")
    if args.use_liger_kernel:
        reasons.append("Liger's GRPO loss runs the model itself")
    if router_loss:
        reasons.append("the Mixture-of-Experts router loss needs the whole sequence in one forward")
    if getattr(model.config, "vision_config", None) is not None:
        reasons.append("a vision-language model (images enter with the prompt)")
    kinds = non_full_attention_cache(model.config)
    if kinds:
        reasons.append(f"the model's cache is not plain full attention ({', '.join(kinds)})")
    return reasons


class _AddGradient(torch.autograd.Function):
    """Identity forward; the backward adds `extra`, the gradient the group's other rows sent to detached copies."""

    @staticmethod
    def forward(ctx, x, extra):
        ctx.extra = extra
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad + ctx.extra, None


@dataclass
class _Group:
    prompt: torch.Tensor                        # the prompt's ids without padding: every row must have them
    live: list[tuple[torch.Tensor, torch.Tensor]]      # each layer's keys and values, in the prompt's graph
    copies: list[tuple[torch.Tensor, torch.Tensor]]    # detached leaves the other rows attend to
    rows_left: int


class PromptSharing:
    """The groups of the current optimiser step whose prompt has run and whose rows are still to come."""

    def __init__(self, group_size: int):
        self.group_size = group_size
        self.groups: dict[int, _Group] = {}

    def new_batch(self) -> None:
        if self.groups:  # a group's rows split over two optimiser steps would train on stale prompt activations
            raise RuntimeError(f"share_prompt_forward: groups {sorted(self.groups)} of the previous generation batch "
                               "did not get all their rows; turn share_prompt_forward off and report this")

    def row(self, model, group: int, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
            compute_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """Log-probabilities (and entropies) of one row's completion tokens, shaped like TRL's: (1, logits_to_keep),
        padding positions 0. None for a prompt of one token (nothing to share): TRL's own path then."""
        prompt_mask = attention_mask[0, :-logits_to_keep].bool()
        prompt = input_ids[0, :-logits_to_keep][prompt_mask]
        if prompt.numel() < 2:
            return None
        # Completions are right-padded; a row of only padding still runs one position, masked out by the loss.
        length = max(int(attention_mask[0, -logits_to_keep:].sum()), 1)
        completion = input_ids[0, -logits_to_keep:][:length]

        state = self.groups.get(group)
        if state is None:
            live = prompt_key_values(model, prompt[None, :-1])
            copies = [(k.detach().requires_grad_(), v.detach().requires_grad_()) for k, v in live]
            state = self.groups[group] = _Group(prompt, live, copies, self.group_size)
        elif not torch.equal(state.prompt, prompt):
            raise RuntimeError(f"share_prompt_forward: rows of group {group} have different prompts")
        state.rows_left -= 1
        if state.rows_left == 0:
            del self.groups[group]
            kv = [tuple(x if c.grad is None else _AddGradient.apply(x, c.grad) for x, c in zip(pair, copy))
                  for pair, copy in zip(state.live, state.copies)]
        else:
            kv = state.copies
        log_probs, entropy = fused_logps_after(model, kv, torch.cat([prompt[-1:], completion[:-1]])[None],
                                               completion[None])
        pad = (0, logits_to_keep - length)
        return F.pad(log_probs, pad), F.pad(entropy, pad) if compute_entropy else None


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
