"""Dynamic sampling and the pass-rate curriculum on the trainer (the pool, pass rates, refill bookkeeping and the
start-up checks are grpo_recipes/grpo/sampling.py): `scoring_batch` swaps shelved questions out (curriculum), `refilled`
observes the pass rates and refills equal-reward groups round by round (dynamic sampling)."""

from __future__ import annotations

import torch
from accelerate.utils import gather_object

from ...tasks.data import question_key
from .. import sampling
from ..diagnostics import correctness_index
from ..sampling import (
    PassRates,
    PromptPool,
    Refill,
    SamplingSpec,
    SamplingState,
    merge,
    merge_gathered,
    merge_table,
    uninformative,
)
from .base import TrainerFeature


class Sampling(TrainerFeature):
    reads_rewards = True

    def __init__(self, spec: SamplingSpec, correctness: tuple[int, float] = (0, 1.0)):
        self.spec = spec
        self.correctness, self.threshold = correctness  # which reward, at what score, means solved
        self._rates: PassRates | None = None
        self._pool: PromptPool | None = None

    @classmethod
    def from_recipe(cls, recipe, training, reward_names):
        spec = SamplingSpec.from_recipe(recipe)
        if spec is None:
            return None
        return cls(spec, (correctness_index(reward_names, recipe.correctness_reward), recipe.correctness_threshold))

    @classmethod
    def problems(cls, recipe, training) -> list[str]:
        return sampling.problems(recipe, training)

    def attach(self, trainer) -> bool:
        spec = self.spec
        self._rates = PassRates() if spec.curriculum else None
        # Each process draws its own prompts (its own seed); a resumed run takes the pool's place back.
        process = trainer.accelerator.process_index
        self._pool = PromptPool(len(trainer.train_dataset), trainer.args.seed * 1009 + process,
                                sampling.row_keys(trainer.train_dataset), self._rates, spec.low, spec.high,
                                spec.recheck, min_tried=trainer.num_generations)
        trainer.add_callback(SamplingState(self._pool, self._rates, process))
        return True

    def scoring_batch(self, trainer, inputs) -> None:
        if self.spec.curriculum and trainer.model.training:
            self._swap_shelved(trainer, inputs)

    def _swap_shelved(self, trainer, inputs: list[dict]) -> None:
        """The curriculum: a group whose question is shelved gives its place to a drawn prompt (in place: TRL
        generates for this list)."""
        group, swapped = trainer.num_generations, 0
        for start in range(0, len(inputs), group):
            if not self._pool.lets_through(question_key(inputs[start]["question"])):
                row = trainer.train_dataset[self._pool.draw(1)[0]]
                inputs[start:start + group] = [dict(row) for _ in range(group)]
                swapped += 1
        trainer.metrics("train")["sampling/frac_groups_swapped"].append(swapped * group / len(inputs))

    def _observe(self, trainer, inputs: list[dict], rewards: torch.Tensor) -> None:
        """The curriculum's pass rates, from a scored round: every process's groups (gathered), the same table on
        every process."""
        group = trainer.num_generations
        keys = [question_key(inputs[i]["question"]) for i in range(0, len(inputs), group)]
        if trainer.accelerator.num_processes > 1:
            keys = gather_object(keys)
        solved = (rewards[:, self.correctness] >= self.threshold).view(-1, group).sum(dim=1).tolist()
        self._rates.update(keys, [int(n) for n in solved], group)

    def _equal(self, trainer, rewards: torch.Tensor) -> list[bool]:
        return uninformative(rewards, trainer.reward_weights, trainer.num_generations, self.spec.signal,
                             self.correctness).tolist()

    def refilled(self, trainer, inputs, output: dict) -> dict:
        if not trainer.model.training:
            return output
        group, processes = trainer.num_generations, trainer.accelerator.num_processes
        first, first_lengths = trainer.captured_rewards()
        rewards, lengths = [first], [first_lengths]
        if self._rates is not None:
            self._observe(trainer, inputs, rewards[0])
        if not self.spec.dynamic:
            return output
        per = len(inputs) // group
        equal = self._equal(trainer, rewards[0])
        refill, outputs, tables, rounds = Refill.start(equal, processes), [output], [trainer.completion_rows()], 0
        while refill.unfilled and rounds < self.spec.max_rounds:
            rounds += 1
            rows = [dict(trainer.train_dataset[i]) for i in self._pool.draw(per) for _ in range(group)]
            outputs.append(trainer.generate_and_score(rows))
            tables.append(trainer.completion_rows())
            round_rewards, round_lengths = trainer.captured_rewards()
            rewards.append(round_rewards)
            lengths.append(round_lengths)
            if self._rates is not None:
                self._observe(trainer, rows, rewards[-1])
            refill.fill(rounds, self._equal(trainer, rewards[-1]))
        process = trainer.accelerator.process_index
        mine = [(r, g - process * per) for r, g in refill.sources[process]]
        merged = merge(outputs, mine, group, trainer.processing_class.pad_token_id)
        merged["num_items_in_batch"] = trainer.loss_mask_count(merged)
        trainer.keep_rewards(merge_gathered(rewards, refill, group), merge_gathered(lengths, refill, group))
        if trainer.log_completions:  # the table shows the batch trained on, not the last round's
            trainer.set_completion_rows(merge_table(tables, refill, group))
        train = trainer.metrics("train")
        train["sampling/rounds"].append(float(rounds))
        train["sampling/prompts_drawn"].append(float(rounds * per * processes))
        train["sampling/groups_discarded"].append(float(rounds * per * processes))
        train["sampling/frac_equal_groups_sampled"].append(sum(equal) / len(equal))
        train["sampling/groups_unfilled"].append(float(refill.unfilled))
        return merged
