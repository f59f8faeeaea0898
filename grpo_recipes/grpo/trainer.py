"""RecipeTrainer: TRL's GRPOTrainer plus this project's features, each one module of grpo_recipes/grpo/features/.

RecipeTrainer implements the public hooks of trl_internals.HookedGRPOTrainer, which calls them from GRPOTrainer's
private steps (that module names every TRL internal; its table says which hook stands for which step), and hands each
hook to its features (features.base.TrainerFeature) in the order stages/grpo.py FEATURES lists them. What it keeps itself
is what the features share:
- the batch's rewards: `scored_rewards` receives TRL's own reward step's result, already gathered over all
  processes, and keeps it (with the completion lengths, gathered the same way, so rows line up) for the features that
  read them (`captured_rewards`) until the batch is scored (`scored_batch`);
- the rows being generated (`batch_inputs`): the generation batch's, or a refill round's (`generate_and_score`);
- the rows a demonstration took (`demonstrated`), for the diagnostics to count as the policy's unsolved samples;
- the loss chain: the first feature's loss that is not None, else TRL's (`trl_loss`).

`log` logs TRL's completions table once per step: not again with the end-of-training summary.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch
from transformers import Trainer

from ..trl_internals import HookedGRPOTrainer
from ..vllm.cpu_sync import cpu_weight_sync
from .features.base import TrainerFeature


class RecipeTrainer(HookedGRPOTrainer):
    def __init__(self, *args, features: Sequence[TrainerFeature] = (), **kwargs):
        with cpu_weight_sync():  # vLLM on a CPU trainer gets a weight sync that works there; GPUs keep TRL's
            super().__init__(*args, **kwargs)
        self._captured: tuple[torch.Tensor, torch.Tensor | None] | None = None
        self.batch_inputs: list[dict] | None = None
        # The gathered rows of the batch being scored whose sampled completion a demonstration replaced (None: no
        # demonstration): what the policy sampled there, it did not solve (features/demonstrations.py).
        self.demonstrated: torch.Tensor | None = None
        self.features = [f for f in features if f is not None and f.attach(self)]
        self._keeps_rewards = any(f.reads_rewards for f in self.features)
        self._keeps_lengths = any(f.reads_lengths for f in self.features)

    # -- what the features share

    def captured_rewards(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The scored batch's rewards (gathered, one column per reward) and completion lengths (None unless a feature
        reads them)."""
        if self._captured is None:  # TRL changed its call graph: fail loudly rather than log or sample blindly
            raise RuntimeError("RecipeTrainer: TRL's reward step (scored_rewards) was not called while scoring "
                               "completions; re-check grpo_recipes/trl_internals.py")
        return self._captured

    def keep_rewards(self, rewards: torch.Tensor, lengths: torch.Tensor | None) -> None:
        """The rewards of the batch trained on, in place of the last scored round's (a refilled batch)."""
        self._captured = (rewards, lengths)

    def generate_and_score(self, rows: list[dict]) -> dict:
        """TRL's generation and scoring of more rows (a refill round), with the generation and reward hooks."""
        self.batch_inputs = rows
        return self.trl_generate_and_score(rows)

    def trl_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """TRL's own loss, for a feature that wraps it."""
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    # -- the hooks, handed to the features in order

    def before_generation(self, prompts):
        for feature in self.features:
            feature.before_generation(self, prompts)

    @contextlib.contextmanager
    def generating(self):
        with contextlib.ExitStack() as stack:
            for feature in self.features:
                stack.enter_context(feature.generating(self))
            yield

    def generated(self, prompts, output):
        for feature in self.features:
            output = feature.generated(self, prompts, output)
        return output

    def scored_rewards(self, inputs, prompts, completions, completion_ids_list, rewards_per_func):
        for feature in self.features:
            feature.scored_rewards(self, inputs, prompts, completions, completion_ids_list, rewards_per_func)
        if self._keeps_rewards:
            lengths = None
            if self._keeps_lengths:
                lengths = torch.tensor([len(ids) for ids in completion_ids_list], device=self.accelerator.device)
                lengths = self.accelerator.gather(lengths)
            self._captured = (rewards_per_func.detach(), lengths)
        return rewards_per_func

    def scoring_batch(self, inputs):
        self.batch_inputs = inputs
        for feature in self.features:
            feature.scoring_batch(self, inputs)

    def refilled(self, inputs, output):
        for feature in self.features:
            output = feature.refilled(self, inputs, output)
        return output

    def scored_batch(self, inputs, output):
        self.batch_inputs = None
        for feature in self.features:
            output = feature.scored_batch(self, inputs, output)
        self._captured, self.demonstrated = None, None
        return output

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        for feature in self.features:
            loss = feature.loss(self, model, inputs, return_outputs, num_items_in_batch)
            if loss is not None:
                return loss
        return self.trl_loss(model, inputs, return_outputs, num_items_in_batch)

    def shared_logps(self, model, input_ids, attention_mask, logits_to_keep, compute_entropy):
        for feature in self.features:
            shared = feature.shared_logps(self, model, input_ids, attention_mask, logits_to_keep, compute_entropy)
            if shared is not None:
                return shared
        return None

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        # TRL logs the completions table (and prints it) at every log call. Trainer.train's closing summary
        # (train_runtime, ...) is one more call at the last step, which would log that step's table a second time.
        if "train_runtime" not in logs:
            return super().log(logs, start_time)
        keep, self.log_completions = self.log_completions, False
        try:
            super().log(logs, start_time)
        finally:
            self.log_completions = keep

    def log_now(self, logs: dict[str, float]) -> None:
        """Log `logs` at the current step through the callbacks (Trackio...), leaving TRL's pending metrics alone.

        GRPOTrainer.log would average and clear the training metrics gathered since the last log; an evaluation
        logged between two training logs must not take them away from the next one.
        """
        Trainer.log(self, dict(logs))

