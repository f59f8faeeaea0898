"""The `grpo` stage: the GRPO trainer (trainer.RecipeTrainer) on the run's training rows, with its features and
alerts. FEATURES lists the trainer's features (grpo_recipes/grpo/features/), in the order the trainer hands them each hook:
each is built from the recipe (`from_recipe`) and checks its own settings (`problems`, `data_problems`)."""

from __future__ import annotations

from trl import get_peft_config

from ..grpo.alerts import AlertCallback, AlertConfig, default_detectors
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

    def run_label(self, training) -> list[str]:
        """The settings a derived run name shows, after the recipe and model names."""
        eps = f"{training.epsilon:g}" + (f"-{training.epsilon_high:g}" if training.epsilon_high else "")
        return [f"lr{training.learning_rate:g}", f"eps{eps}", f"beta{training.beta:g}", f"seed{training.seed}"]

    def describe(self, run) -> str:
        held_out = len(run.held_out) if run.held_out is not None else 0
        return f"grpo: {len(run.train)} train rows, {held_out} held-out rows"

    def problems(self, recipe, model_args=None) -> list[str]:
        return [m for f in FEATURES for m in f.problems(recipe, self.plan.training)]

    def data_problems(self, recipe, train) -> list[str]:
        return [m for f in FEATURES for m in f.data_problems(recipe, self.plan.training, train)]

    def configure(self, run) -> None:
        """Last settings on the stage's training config once the rewards are compiled."""
        self.plan.training.reward_weights = [s.weight for s in run.recipe.reward_specs]

    def make_trainer(self, run, model_path: str):
        names = [f.__name__ for f in run.funcs]
        return RecipeTrainer(
            model=model_path,
            reward_funcs=run.funcs,
            args=self.plan.training,
            train_dataset=self.dataset(run),
            peft_config=get_peft_config(run.model_args),
            features=[f.from_recipe(run.recipe, self.plan.training, names) for f in FEATURES],
            **tool_kwargs(run.recipe, model_path),
        )

    def callbacks(self, trainer, run) -> list:
        """The alerts, as configured (the held-out evaluation is the run's: runner.attach_evaluation)."""
        recipe = run.recipe
        if not recipe.alerts:
            return []
        names = [f.__name__ for f in run.funcs]
        correctness = names[correctness_index(names, recipe.correctness_reward)]
        cfg = AlertConfig.from_recipe(recipe)
        detectors = default_detectors(cfg, names, correctness, recipe.format_reward)
        detectors += [d for f in FEATURES for d in f.detectors(recipe, cfg)]
        return [AlertCallback(detectors)]


def tool_kwargs(recipe, model_path: str) -> dict:
    """GRPOTrainer's tool arguments for a run with tools (none otherwise). The template is checked here, right after
    the model is resolved and before its weights load; names and params were checked at start-up (checks.py)."""
    if not recipe.uses_tools:
        return {}
    known = tools.available(recipe.tool_dirs or ())
    return {"processing_class": tool_tokenizer(recipe, model_path),
            "tools": tools.build_tools(recipe.tools, known),
            "environment_factory": tools.build_environment(recipe.environment, tools.environments())}
