"""share_prompt_prefill on the trainer (the cache is built by grpo_recipes/grpo/prefill.py): while TRL generates, the
policy's generate() prefills each distinct prompt of the batch once, instead of once per completion."""

from __future__ import annotations

import contextlib
import logging

from ..prefill import generate_prefilled
from .base import TrainerFeature

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
                               "turn share_prompt_prefill off and re-check grpo_recipes/grpo/features/prefill.py")

