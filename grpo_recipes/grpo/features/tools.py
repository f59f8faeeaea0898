"""Tool rollouts (recipe `tools:` / `environment:`; grpo_recipes/tools/registry.py, docs/agent.md), on the trainer side.

- `before_generation`: TRL builds one tool table per rollout (`tool_tables()`) right before generating. INVALID_CALL,
  the call tool_templates' parser makes of a malformed block or an unknown tool, is added to each table, so the model
  reads what was wrong instead of TRL ending the episode silently. Fails loudly if TRL renames its attribute.
- `scored_rewards`: the completions are message lists there; the batch's tool metrics (episodes.tool_metrics)
  join `metrics(mode)` like the diagnostics, and each episode's one-line transcript becomes an `episode` column of the
  completions table (Parquet keeps `tool_calls` only as a Python repr).
The trainer's tool arguments (tools, environment, template) are grpo_stage.tool_kwargs'; the settings' checks,
shared with the sft stage's tool trajectories, are checks.tool_problems.
"""

from __future__ import annotations

from ...tools.episodes import tool_metrics, transcript
from ...tools.registry import invalid_call_handler
from ...tools.templates import INVALID_CALL
from .base import TrainerFeature


class ToolCalls(TrainerFeature):
    @classmethod
    def from_recipe(cls, recipe, training, reward_names):
        return cls() if recipe.uses_tools else None

    def attach(self, trainer) -> bool:
        return bool(trainer.tools)  # TRL sets it for tools and for an environment's methods alike

    def before_generation(self, trainer, prompts) -> None:
        for table in trainer.tool_tables():
            table.setdefault(INVALID_CALL, invalid_call_handler(lambda t=table: sorted(set(t) - {INVALID_CALL})))

    def scored_rewards(self, trainer, inputs, prompts, completions, completion_ids, rewards) -> None:
        mode = "train" if trainer.model.training else "eval"
        # Local rows only, like TRL's own tools/* metrics; log() averages them over the logging window.
        for name, value in tool_metrics(completions, [x.get("answer") for x in inputs]).items():
            trainer.metrics(mode)[name].append(value)
        trainer.log_extra_column("episode", [transcript(c) for c in completions])
