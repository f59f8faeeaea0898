"""Prompt prefill run once for what a batch's rows share, for transformers' generate(): the cache builder, and
`share_prompt_prefill` on the trainer.

generate() prefills every row's prompt in full. A GRPO batch holds each prompt num_generations times, and on CPU
the prompt (chat template, few-shot turns: ~55 tokens in the math default) costs as much as the completion. Here the
prefix every distinct prompt shares runs once at batch size 1, each distinct prompt's rest (padded between the prefix
and itself, positions numbered as generate() numbers padded ones) runs once, and the KV cache is then copied to every
row that asks for it; generate() runs each row's last prompt token against it and decodes. The tokens are
generate()'s up to float rounding (tests/test_prefill.py), sampling draws the same random numbers in the same order.

Used by the held-out evaluation (evaluation/heldout.py) and by GRPO's own generation (`share_prompt_prefill`: while
TRL generates, the policy's generate() prefills each distinct prompt of the batch once, `PromptPrefill`)."""

from __future__ import annotations

import contextlib
import copy
import logging
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from .base import TrainerFeature


def common_prefix(prompt_ids: list[list[int]]) -> int:
    """Leading tokens every prompt shares, short of each prompt's last (generate() must run one token itself)."""
    first, limit = prompt_ids[0], min(len(p) for p in prompt_ids) - 1
    return next((i for i in range(limit) if any(p[i] != first[i] for p in prompt_ids)), max(limit, 0))


@dataclass
class Prefilled:
    ids: torch.Tensor  # one row per prompt: the shared prefix, padding, the prompt's rest
    mask: torch.Tensor
    cache: DynamicCache | None  # every position but each row's last; None: nothing to share, generate() prefills

    def rows(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, DynamicCache | None]:
        """ids, mask and a cache for the rows `index` (prompt indices; repeats allowed)."""
        if self.cache is None:
            return self.ids[index], self.mask[index], None
        cache = copy.deepcopy(self.cache)  # generate() extends the cache it is given: this one stays as it is
        cache.batch_select_indices(index)
        return self.ids[index], self.mask[index], cache


@torch.no_grad()
def prefill(model, prompt_ids: list[list[int]], pad: int, share_prefix: bool = True, always: bool = False) -> Prefilled:
    """The cache of `prompt_ids` (distinct prompts) up to each one's last token. `share_prefix=False` runs every
    prompt in full (left padding, generate()'s own layout); with nothing shared and `always` false, no cache."""
    device = next(model.parameters()).device
    shared = common_prefix(prompt_ids) if share_prefix else 0
    rests = [p[shared:] for p in prompt_ids]
    width = max(len(r) for r in rests)
    ids = torch.tensor([prompt_ids[0][:shared] + [pad] * (width - len(r)) + r for r in rests], device=device)
    mask = torch.tensor([[1] * shared + [0] * (width - len(r)) + [1] * len(r) for r in rests], device=device)
    if not shared and not (always and width > 1):
        return Prefilled(ids, mask, None)
    cache = DynamicCache(config=model.config)
    # Only the cache is wanted: logits_to_keep=1 spares the vocabulary projection of every prompt position.
    if shared:
        model(input_ids=ids[:1, :shared], cache=cache, use_cache=True, logits_to_keep=1)
        cache.batch_repeat_interleave(len(rests))
    if width > 1:
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        model(input_ids=ids[:, shared:-1], attention_mask=mask[:, :-1], position_ids=positions[:, shared:-1],
              cache=cache, use_cache=True, logits_to_keep=1)
    return Prefilled(ids, mask, cache)


def distinct(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[list[list[int]], torch.Tensor]:
    """The distinct prompts of a left-padded batch, in order of first appearance, and each row's prompt index."""
    seen: dict[tuple[int, ...], int] = {}
    index = [seen.setdefault(tuple(row[m.bool()].tolist()), len(seen)) for row, m in zip(input_ids, attention_mask)]
    return [list(p) for p in seen], torch.tensor(index, device=input_ids.device)


def generate_prefilled(model, generate, input_ids: torch.Tensor, attention_mask: torch.Tensor, generation_config,
                       pad: int) -> torch.Tensor:
    """What `generate(input_ids=..., attention_mask=..., generation_config=...)` returns for a left-padded batch (the
    prompts as given, then the completions), with each distinct prompt prefilled once. `generate` is the model's own
    generate (the class's: the trainer's generation replaces the model's attribute with this function)."""
    prompts, index = distinct(input_ids, attention_mask)
    ids, mask, cache = prefill(model, prompts, pad, always=True).rows(index)
    config = copy.copy(generation_config)
    config.cache_implementation = None  # generate() refuses a cache together with one to build
    out = generate(input_ids=ids, attention_mask=mask, cache=cache, generation_config=config)
    return torch.cat([input_ids, out[:, ids.size(1):]], dim=1)


logger = logging.getLogger("grpo_recipes")


def blockers(args, processing_class) -> list[str]:
    """Why TRL's generation here is not plain transformers generate() on text prompts (none: it is)."""
    reasons = []
    if args.use_vllm:
        reasons.append("vLLM generates (its own prefix caching shares prompts)")
    if getattr(args, "use_transformers_paged", False) or getattr(args, "use_transformers_continuous_batching", False):
        reasons.append("transformers' continuous batching generates")
    if hasattr(processing_class, "image_processor"):
        reasons.append("a multimodal processor (image tokens are not shared)")
    return reasons


class PromptPrefill(TrainerFeature):
    def __init__(self):
        self.calls = 0  # generate() calls taken over, across the run

    @classmethod
    def from_recipe(cls, recipe, training, reward_names):
        return cls() if recipe.share_prompt_prefill else None

    def attach(self, trainer) -> bool:
        reasons = blockers(trainer.args, trainer.processing_class)
        if reasons:
            logger.warning("share_prompt_prefill: off in this run: %s", "; ".join(reasons))
            return False
        return True

    @contextlib.contextmanager
    def generating(self, trainer):
        model = trainer.accelerator.unwrap_model(trainer.model_wrapped)  # the model TRL's generation calls
        before, original, own = self.calls, model.generate, model.__dict__.get("generate")
        pad = trainer.processing_class.pad_token_id

        def generate(input_ids=None, attention_mask=None, generation_config=None, **kwargs):
            if kwargs or input_ids is None or attention_mask is None:  # other inputs (token types...): as it is
                return original(input_ids=input_ids, attention_mask=attention_mask,
                                generation_config=generation_config, **kwargs)
            self.calls += 1
            return generate_prefilled(model, original, input_ids, attention_mask, generation_config, pad)

        model.generate = generate
        try:
            yield
        finally:
            if own is None:
                del model.generate  # the class's generate again
            else:
                model.generate = own
        if trainer.model.training and self.calls == before:  # TRL changed its call: fail loudly, not silently slow
            raise RuntimeError("share_prompt_prefill: TRL's generation did not call the policy's generate(); "
                               "turn share_prompt_prefill off and re-check grpo_recipes/grpo/features/py")

