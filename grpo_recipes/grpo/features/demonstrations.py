"""demonstration_field: a group that none of its sampled completions solves trains on its row's demonstration.

`generated` scores the sampled completions quietly (no reward metrics, no table columns), keeps what they scored, and
puts the row's demonstration in place of the last completion of every group that none of them solved (the
correctness reward at `correctness_threshold`, as in the diagnostics). TRL then scores, builds the tensors and
advantages and logs from what `generated` returned, so a demonstration trains like a sampled row (the only one in its
group with a positive advantage, if it is correct). The metrics a person reads as the policy's stay the policy's:
`scored_batch` puts the sampled completions' means under `rewards/<name>/mean` and `reward`, and what TRL logged for
the trained batch, demonstrations in, under `demonstrations/...`; the diagnostics count a demonstrated row as the
unsolved sample it replaced (RecipeTrainer.demonstrated). Each sampled completion is scored twice. With plain
generation there are no sampling log-probabilities; with vLLM a demonstration's are NaN, which TRL leaves out of its
importance-sampling correction.
"""

from __future__ import annotations

import torch

from ...config.checks import demonstration_column
from ..groups import correctness_index, total_reward
from .base import TrainerFeature


class Demonstrations(TrainerFeature):
    def __init__(self, field: str, demonstrate: bool = True, correctness: tuple[int, float] = (0, 1.0)):
        self.field = field
        self.demonstrate = demonstrate  # False: the column serves an sft stage only
        self.correctness, self.threshold = correctness  # which reward, at what score, means solved
        self._sampled: dict[str, float] | None = None  # the sampled completions' means, until the batch is logged

    @classmethod
    def from_recipe(cls, recipe, training, reward_names):
        if not recipe.demonstration_field:
            return None
        return cls(recipe.demonstration_field, recipe.demonstrate_unsolved_groups,
                   (correctness_index(reward_names, recipe.correctness_reward), recipe.correctness_threshold))

    @classmethod
    def problems(cls, recipe, training) -> list[str]:
        if recipe.demonstration_field and recipe.demonstrate_unsolved_groups and recipe.dynamic_sampling:
            return ["demonstrate_unsolved_groups, dynamic_sampling: both on; a demonstration makes an unsolved group "
                    "informative, so dynamic sampling would never replace it, and the two decide the same groups. "
                    "Fix: demonstrate_unsolved_groups: false (the column then serves an sft stage), or "
                    "dynamic_sampling: false"]
        return []

    @classmethod
    def data_problems(cls, recipe, training, train) -> list[str]:
        field_ = recipe.demonstration_field
        if not field_:
            return []
        if recipe.uses_tools:
            return ["demonstration_field: a demonstration is one text, not a tool episode; unset it for tool recipes"]
        if not recipe.demonstrate_unsolved_groups:
            return []  # the column serves an sft stage only, which checks it (SFTStage.data_problems)
        return demonstration_column(field_, train)

    def attach(self, trainer) -> bool:
        if trainer.rollout_func is not None:  # it returns fields of its own per completion
            raise ValueError("demonstration_field: needs TRL's own generation; unset it with a rollout_func")
        return self.demonstrate

    def generated(self, trainer, prompts, output):
        if not trainer.model.training:
            return output
        prompt_ids, completion_ids, tool_mask, completions, logprobs, *rest = output
        inputs, group = trainer.batch_inputs, trainer.num_generations
        # Scored quietly: TRL scores the batch again, demonstrations in place, and logs that. Gathered, so every
        # process decides the same for every group, including a group whose rows span two processes.
        with trainer.reward_logging_muted():
            rewards = trainer.trl_rewards(inputs, prompts, completions, completion_ids)
        self._sampled = {f"rewards/{name}/mean": torch.nanmean(column).item()
                         for name, column in zip(trainer.reward_func_names, rewards.T)}
        self._sampled["reward"] = torch.nanmean(total_reward(rewards, trainer.reward_weights)).item()
        solved = rewards[:, self.correctness] >= self.threshold  # NaN (unscored) is not solved
        unsolved = (~solved.view(-1, group).any(dim=1)).tolist()
        trainer.demonstrated = torch.tensor([u and r == group - 1 for u in unsolved for r in range(group)])
        offset = trainer.accelerator.process_index * len(inputs)  # TRL's process slice of the gathered rows
        shown = [(offset + i) % group == group - 1 and unsolved[(offset + i) // group] for i in range(len(inputs))]
        for i in (i for i, taught in enumerate(shown) if taught):
            text = inputs[i][self.field]
            ids = trainer.processing_class(text, add_special_tokens=False)["input_ids"]
            completion_ids[i] = ids + trainer.eos_token_ids[:1]  # ended as a generation ends
            completions[i] = [{"role": "assistant", "content": text}] if isinstance(completions[i], list) else text
            if logprobs is not None:
                logprobs[i] = [float("nan")] * len(completion_ids[i])
        trainer.log_extra_column("demonstration", shown)
        trainer.metrics("train")["demonstrations/frac_groups"].append(sum(unsolved) / len(unsolved))
        return prompt_ids, completion_ids, tool_mask, completions, logprobs, *rest

    def scored_batch(self, trainer, inputs, output: dict) -> dict:
        """TRL has logged the trained batch's reward means: the plain names get the sampled completions' back."""
        if self._sampled is not None:
            metrics = trainer.metrics("train")
            for key, sampled in self._sampled.items():
                metrics[f"demonstrations/{key}"].append(metrics[key].pop())  # TRL's, demonstrations in
                metrics[key].append(sampled)
            self._sampled = None
        return output
