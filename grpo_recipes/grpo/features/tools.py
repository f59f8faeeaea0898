"""Tool rollouts (recipe `tools:` / `environment:`; grpo_recipes/tools/registry.py, docs/agent.md), on the trainer side.

- `before_generation`: TRL builds one tool table per rollout (`tool_tables()`) right before generating. INVALID_CALL,
  the call tool_templates' parser makes of a malformed block or an unknown tool, is added to each table, so the model
  reads what was wrong instead of TRL ending the episode silently. Fails loudly if TRL renames its attribute.
- `scored_rewards`: the completions are message lists there; the batch's tool metrics (episodes.tool_metrics)
  join `metrics(mode)` like the diagnostics, and each episode's one-line transcript becomes an `episode` column of the
  completions table (Parquet keeps `tool_calls` only as a Python repr).
The trainer's tool arguments (tools, environment, template) are stages/grpo.py tool_kwargs'; the settings' checks,
shared with the sft stage's tool trajectories, are checks.tool_problems.
"""

from __future__ import annotations

from ...tools.episodes import tool_metrics, transcript
from ...tools.registry import invalid_call_handler
from ...tools.templates import INVALID_CALL
from ..alerts import MISSING, Baseline, Detector, _value
from .base import TrainerFeature


class ToolCalls(TrainerFeature):
    @classmethod
    def from_recipe(cls, recipe, training, reward_names):
        return cls() if recipe.uses_tools else None

    @classmethod
    def detectors(cls, recipe) -> list[Detector]:
        return [ToolsAbandoned(recipe), ToolResultIgnored(recipe)] if recipe.uses_tools else []

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


class ToolsAbandoned(Detector):
    """The policy stopped calling tools: the call rate fell below a share of its early level."""

    name, title = "tools_abandoned", "Tool use abandoned"
    advice = ("Episodes no longer call tools. If accuracy fell with it, tool errors made calling costly (see "
              "tools/error_rate) or the task no longer needs the tool; read the completions table's `episode` column "
              "for what replaced the calls.")
    FLOOR = 0.05  # below this early call rate there was no tool use to abandon (the SFT warm-up's job)

    def __init__(self, cfg, patience=None):
        super().__init__(cfg, patience)
        self.baseline = Baseline(cfg.alert_baseline_steps)

    def observe(self, metrics):
        rate = _value(metrics, "tools/call_rate")
        if rate is None:
            return MISSING
        base = self.baseline.feed(rate)
        if base is None or base < self.FLOOR:
            return MISSING
        limit = max(self.FLOOR, self.cfg.alert_tools_abandoned_frac * base)
        return f"tool-call rate {rate:.2f} < {limit:.2f} (early level {base:.2f})" if rate < limit else None


class ToolResultIgnored(Detector):
    """Tools are called, but what the model answers is not what they returned: calls made for their own sake."""

    name, title = "tool_result_ignored", "Tool results ignored"
    advice = ("Episodes call tools but answer with something else. Check that no reward pays for calling by itself "
              "(tool_grounded pays only for a correct answer a tool returned) and read the completions table.")
    MIN_CALL_RATE = 0.2  # too few calls to judge below this

    def observe(self, metrics):
        rate, used = _value(metrics, "tools/call_rate"), _value(metrics, "tools/answer_from_tool_rate")
        if rate is None or used is None:
            return MISSING
        if rate >= self.MIN_CALL_RATE and used < self.cfg.alert_tool_result_used_min:
            return f"{rate:.0%} of episodes call a tool but only {used:.0%} of those with a result answer with it"
        return None
