"""The `grpo` stage: the GRPO trainer (grpo/trainer.RecipeTrainer) on the run's training rows, with its features and
alerts. FEATURES lists the trainer's features (grpo_recipes/grpo/features/), in the order the trainer hands them each
hook: each is built from the recipe (`from_recipe`), checks its own settings (`problems`, `data_problems`) and names
the alerts that watch its metrics (`detectors`)."""

from __future__ import annotations

from trl import get_peft_config

from ..grpo.alerts import AlertCallback, default_detectors
from ..grpo.features.demonstrations import Demonstrations
from ..grpo.features.diagnostics import Diagnostics
from ..grpo.features.prefill import PromptPrefill
from ..grpo.features.sampling import Sampling
from ..grpo.features.sharing import PromptSharingFeature
from ..grpo.features.skip import SkipZeroAdvantage
from ..grpo.features.tools import ToolCalls
from ..grpo.groups import correctness_index
from ..grpo.trainer import RecipeTrainer
from ..tools import registry as tools
from .base import Stage, tool_tokenizer

# The trainer's features, in the order each hook reaches them: the skip's loss comes before prompt sharing's (a
# skipped micro-batch runs no forward at all), the tool metrics before the rewards are kept.
FEATURES = (ToolCalls, Demonstrations, Sampling, SkipZeroAdvantage, PromptSharingFeature, PromptPrefill,
            Diagnostics)


class GRPOStage(Stage):
    """GRPO by RecipeTrainer (GRPOTrainer with this project's features), on the run's training rows."""

    name = "grpo"

    def describe(self, run) -> str:
        held_out = len(run.held_out) if run.held_out is not None else 0
        return f"grpo: {len(run.train)} train rows, {held_out} held-out rows"

    def problems(self, config) -> list[str]:
        return [m for f in FEATURES for m in f.problems(config.recipe, self.spec.training)]

    def data_problems(self, config, train) -> list[str]:
        """The features' and one generation batch's: TRL's RepeatSampler drops an incomplete last group of prompts,
        so with fewer distinct training prompts than one generation batch needs it yields no batch at all and
        training stops at step 0 without an error."""
        grpo = self.spec.training
        out = [m for f in FEATURES for m in f.data_problems(config.recipe, grpo, train)]
        prompts = grpo.generation_batch_size // grpo.num_generations
        if len(train) < prompts:
            out.append(f"train_size: the dataset has {len(train)} training rows, but one generation batch needs "
                       f"{prompts} distinct prompts (generation_batch_size {grpo.generation_batch_size} / "
                       f"num_generations {grpo.num_generations}). Fix: more training rows, or a smaller "
                       "per_device_train_batch_size")
        return out

    def make_trainer(self, run, model_path: str):
        names = [f.__name__ for f in run.funcs]
        return RecipeTrainer(
            model=model_path,
            reward_funcs=run.funcs,
            args=self.spec.training,
            train_dataset=self.dataset(run),
            peft_config=get_peft_config(run.model_args),
            features=[f.from_recipe(run.recipe, self.spec.training, names) for f in FEATURES],
            **tool_kwargs(run.recipe, model_path),
        )

    def callbacks(self, trainer, run) -> list:
        """The alerts, as configured (the held-out evaluation is the run's: runner.attach_evaluation)."""
        recipe = run.recipe
        if not recipe.alerts:
            return []
        names = [f.__name__ for f in run.funcs]
        correctness = names[correctness_index(names, recipe.correctness_reward)]
        detectors = default_detectors(recipe, names, correctness, recipe.format_reward)
        detectors += [d for f in FEATURES for d in f.detectors(recipe)]
        return [AlertCallback(detectors)]


def tool_kwargs(recipe, model_path: str) -> dict:
    """GRPOTrainer's tool arguments for a run with tools (none otherwise). The template is checked here, right after
    the model is resolved and before its weights load; names and params were checked at start-up (checks.py)."""
    if not recipe.uses_tools:
        return {}
    return {"processing_class": tool_tokenizer(recipe, model_path),
            "tools": tools.recipe_tools(recipe),
            "environment_factory": tools.build_environment(recipe.environment, tools.environments())}
