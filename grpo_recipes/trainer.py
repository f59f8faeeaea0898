"""RecipeTrainer: TRL's GRPOTrainer plus per-generation-batch diagnostics (diagnostics.py).

RecipeTrainer implements the public hooks of trl_internals.HookedGRPOTrainer, which calls them from GRPOTrainer's
private steps (that module names every TRL internal; its table says which hook stands for which step).

How the numbers are captured, without an extra forward pass:
- `scored_rewards` receives TRL's own reward step's result, already gathered over all processes. The hook keeps it,
  with the completion lengths (gathered the same way, so rows line up).
- `scored_batch` receives this process's slice of the advantages TRL computed; gathering them gives the whole batch,
  in the same row order as the rewards (TRL itself slices by process index).
- The diagnostics are appended to `self.metrics(mode)`, next to TRL's `reward` and `frac_reward_zero_std`, so TRL's
  `log()` averages them over the logging window and every `report_to` backend receives them.

A generation batch can serve several optimiser steps (steps_per_generation, num_iterations): its diagnostics are
recorded once, when it is generated, exactly like TRL's reward metrics, and appear in the next log.

With `demonstration_field`, `generated` scores the sampled completions quietly (no metrics, no table columns; only
`rewards/<name>/sampled_mean`, the policy's own), and puts the row's demonstration in place of the last completion
of every group that none of them solved (the correctness reward at `correctness_threshold`, as in the diagnostics).
TRL then scores, builds the tensors and advantages and logs from what `generated` returned, so a demonstration
trains like a sampled row (the only one in its group with a positive advantage, if it is correct) and counts in
`rewards/*` and `diag/*`. Each sampled completion is scored twice. With plain generation there are no sampling
log-probabilities; with vLLM a demonstration's are NaN, which TRL leaves out of its importance-sampling correction.

`log` logs TRL's completions table once per step: not again with the end-of-training summary.

With `share_prompt_forward` (prompt_sharing.py), `scored_batch` tags each row with its group, `compute_loss` passes
a row's tag on, and `shared_logps`, for the loss's own call only, runs the row against its group's shared prompt cache.

With tools (recipe `tools:` / `environment:`), two more hooks:
- `before_generation`: TRL builds one tool table per rollout (`tool_tables()`) right before generating. INVALID_CALL,
  the call tool_templates' parser makes of a malformed block or an unknown tool, is added to each table, so the model
  reads what was wrong instead of TRL ending the episode silently. Fails loudly if TRL renames its attribute.
- `scored_rewards`: the completions are message lists there; the batch's tool metrics (episodes.tool_metrics)
  join `metrics(mode)` like the diagnostics, and each episode's one-line transcript becomes an `episode` column of the
  completions table (Parquet keeps `tool_calls` only as a Python repr).
"""

from __future__ import annotations

import logging

import torch
from accelerate.utils import gather_object
from transformers import Trainer

from .data import question_key
from .diagnostics import DiagnosticsSpec, batch_diagnostics, correctness_index, equal_reward_groups
from .episodes import tool_metrics, transcript
from .prompt_sharing import PromptSharing
from .prompt_sharing import blockers as share_blockers
from .sampling import (PassRates, PromptPool, Refill, SamplingSpec, SamplingState, merge, merge_gathered,
                       merge_table, row_keys)
from .tool_templates import INVALID_CALL
from .tools import invalid_call_handler
from .trl_internals import HookedGRPOTrainer
from .vllm_cpu_sync import cpu_weight_sync

logger = logging.getLogger("grpo_recipes")
EQUAL_GROUP = "equal_reward_group"  # the batch key that marks rows to skip (skip_zero_advantage_batches)
PROMPT_GROUP = "prompt_group"  # the batch key that names each row's group (share_prompt_forward)


def skip_blockers(args, processes: int, router_loss: bool) -> list[str]:
    """Why skipping the rows of equal-reward groups would not be exact in this run (none: it is)."""
    reasons = []
    if args.beta != 0:
        reasons.append(f"beta {args.beta:g} gives every row a KL gradient")
    if args.entropy_coef != 0 or args.use_adaptive_entropy:
        reasons.append("the entropy bonus (entropy_coef, use_adaptive_entropy) trains every row")
    if args.multi_objective_aggregation != "sum_then_normalize":
        reasons.append(f"multi_objective_aggregation {args.multi_objective_aggregation} normalises over the batch, "
                       "so a group that scored alike still has advantages")
    if router_loss:
        reasons.append("the Mixture-of-Experts router loss trains every row")
    if processes > 1:
        # DDP broadcasts buffers in every forward and all-reduces in the last backward; FSDP and DeepSpeed gather in
        # every forward: a process that skipped alone would leave the others waiting.
        reasons.append(f"{processes} processes would each have to skip the same micro-batches")
    return reasons


class RecipeTrainer(HookedGRPOTrainer):
    def __init__(self, *args, diagnostics: DiagnosticsSpec | None = None, skip_zero_advantage: bool = False,
                 share_prompt: bool = False, demonstration_field: str | None = None,
                 correctness: tuple[int, float] = (0, 1.0), demonstrate_unsolved: bool = True,
                 sampling: SamplingSpec | None = None, **kwargs):
        with cpu_weight_sync():  # vLLM on a CPU trainer gets a weight sync that works there; GPUs keep TRL's
            super().__init__(*args, **kwargs)
        self.diagnostics = diagnostics
        self._captured: tuple[torch.Tensor, torch.Tensor | None] | None = None
        blockers = skip_blockers(self.args, self.accelerator.num_processes, self.aux_loss_enabled)
        if skip_zero_advantage and blockers:
            logger.warning("skip_zero_advantage_batches: off in this run: %s", "; ".join(blockers))
            skip_zero_advantage = False
        self.skip_zero_advantage = skip_zero_advantage
        blockers = (share_blockers(self.args, self.accelerator.num_processes, self.model, self.aux_loss_enabled)
                    if share_prompt else [])
        if blockers:
            logger.warning("share_prompt_forward: off in this run: %s", "; ".join(blockers))
        self._sharing = PromptSharing(self.num_generations) if share_prompt and not blockers else None
        self._sharing_group: int | None = None
        if demonstration_field and self.rollout_func is not None:  # it returns fields of its own per completion
            raise ValueError("demonstration_field: needs TRL's own generation; unset it with a rollout_func")
        self.demonstration_field = demonstration_field
        self.demonstrate_unsolved = bool(demonstration_field) and demonstrate_unsolved
        self._correctness, self._threshold = correctness  # which reward, at what score, means solved
        self._batch_inputs: list[dict] | None = None
        self._sampling = sampling if sampling is not None and (sampling.dynamic or sampling.curriculum) else None
        if self._sampling is not None:
            self._rates = PassRates() if sampling.curriculum else None
            # Each process draws its own prompts (its own seed); a resumed run takes the pool's place back.
            self._pool = PromptPool(len(self.train_dataset), self.args.seed * 1009 + self.accelerator.process_index,
                                    row_keys(self.train_dataset), self._rates, sampling.low, sampling.high,
                                    sampling.recheck, min_tried=self.num_generations)
            self.add_callback(SamplingState(self._pool, self._rates, self.accelerator.process_index))

    @property
    def _uses_tools(self) -> bool:
        return bool(self.tools)  # TRL sets it for tools and for an environment's methods alike

    def before_generation(self, prompts):
        if self._uses_tools:
            for table in self.tool_tables():
                table.setdefault(INVALID_CALL, invalid_call_handler(lambda t=table: sorted(set(t) - {INVALID_CALL})))

    def generated(self, prompts, output):
        if self.demonstrate_unsolved and self.model.training:
            output = self._demonstrate(prompts, output)
        return output

    def _demonstrate(self, prompts, output):
        prompt_ids, completion_ids, tool_mask, completions, logprobs, *rest = output
        inputs, group = self._batch_inputs, self.num_generations
        # Scored quietly: TRL scores the batch again, demonstrations in place, and logs that. Gathered, so every
        # process decides the same for every group, including a group whose rows span two processes.
        with self.reward_logging_muted():
            rewards = self.trl_rewards(inputs, prompts, completions, completion_ids)
        for name, column in zip(self.reward_func_names, rewards.T):
            self.metrics("train")[f"rewards/{name}/sampled_mean"].append(torch.nanmean(column).item())
        solved = rewards[:, self._correctness] >= self._threshold  # NaN (unscored) is not solved
        unsolved = (~solved.view(-1, group).any(dim=1)).tolist()
        offset = self.accelerator.process_index * len(inputs)  # TRL's process slice of the gathered rows
        shown = [(offset + i) % group == group - 1 and unsolved[(offset + i) // group] for i in range(len(inputs))]
        for i in (i for i, taught in enumerate(shown) if taught):
            text = inputs[i][self.demonstration_field]
            ids = self.processing_class(text, add_special_tokens=False)["input_ids"]
            completion_ids[i] = ids + self.eos_token_ids[:1]  # ended as a generation ends
            completions[i] = [{"role": "assistant", "content": text}] if isinstance(completions[i], list) else text
            if logprobs is not None:
                logprobs[i] = [float("nan")] * len(completion_ids[i])
        self.log_extra_column("demonstration", shown)
        self.metrics("train")["frac_groups_demonstrated"].append(sum(unsolved) / len(unsolved))
        return prompt_ids, completion_ids, tool_mask, completions, logprobs, *rest

    def scored_rewards(self, inputs, prompts, completions, completion_ids_list, rewards_per_func):
        if self._uses_tools:
            mode = "train" if self.model.training else "eval"
            # Local rows only, like TRL's own tools/* metrics; log() averages them over the logging window.
            for name, value in tool_metrics(completions, [x.get("answer") for x in inputs]).items():
                self.metrics(mode)[name].append(value)
            self.log_extra_column("episode", [transcript(c) for c in completions])
        if self.diagnostics is not None or self.skip_zero_advantage or self._sampling is not None:
            lengths = None  # only the diagnostics read them
            if self.diagnostics is not None:
                lengths = torch.tensor([len(ids) for ids in completion_ids_list], device=self.accelerator.device)
                lengths = self.accelerator.gather(lengths)
            self._captured = (rewards_per_func.detach(), lengths)
        return rewards_per_func

    def scoring_batch(self, inputs):
        self._batch_inputs = inputs  # _demonstrate reads each group's demonstration from its row
        if self._sampling is not None and self._sampling.curriculum and self.model.training:
            self._swap_shelved(inputs)

    def _swap_shelved(self, inputs: list[dict]) -> None:
        """The curriculum: a group whose question is shelved gives its place to a drawn prompt (in place: TRL
        generates for this list)."""
        group, swapped = self.num_generations, 0
        for start in range(0, len(inputs), group):
            if not self._pool.lets_through(question_key(inputs[start]["question"])):
                row = self.train_dataset[self._pool.draw(1)[0]]
                inputs[start:start + group] = [dict(row) for _ in range(group)]
                swapped += 1
        self.metrics("train")["sampling/frac_groups_swapped"].append(swapped * group / len(inputs))

    def _observe(self, inputs: list[dict], rewards: torch.Tensor) -> None:
        """The curriculum's pass rates, from a scored round: every process's groups (gathered), the same table on
        every process."""
        group = self.num_generations
        keys = [question_key(inputs[i]["question"]) for i in range(0, len(inputs), group)]
        if self.accelerator.num_processes > 1:
            keys = gather_object(keys)
        solved = (rewards[:, self._correctness] >= self._threshold).view(-1, group).sum(dim=1).tolist()
        self._rates.update(keys, [int(n) for n in solved], group)

    def refilled(self, inputs, output):
        if self._sampling is None or not self.model.training:
            return output
        if self._captured is None:  # TRL changed its call graph: fail loudly rather than sample blindly
            raise RuntimeError("RecipeTrainer: TRL's reward step (scored_rewards) was not called while scoring "
                               "completions; re-check grpo_recipes/trl_internals.py")
        group, processes = self.num_generations, self.accelerator.num_processes
        rewards, lengths = [self._captured[0]], [self._captured[1]]
        if self._rates is not None:
            self._observe(inputs, rewards[0])
        if not self._sampling.dynamic:
            return output
        per = len(inputs) // group
        equal = equal_reward_groups(rewards[0], self.reward_weights, group).tolist()
        refill, outputs, tables, rounds = Refill.start(equal, processes), [output], [self.completion_rows()], 0
        while refill.unfilled and rounds < self._sampling.max_rounds:
            rounds += 1
            rows = [dict(self.train_dataset[i]) for i in self._pool.draw(per) for _ in range(group)]
            self._batch_inputs = rows
            outputs.append(self.trl_generate_and_score(rows))
            tables.append(self.completion_rows())
            rewards.append(self._captured[0])
            lengths.append(self._captured[1])
            if self._rates is not None:
                self._observe(rows, rewards[-1])
            refill.fill(rounds, equal_reward_groups(rewards[-1], self.reward_weights, group).tolist())
        mine = [(r, g - self.accelerator.process_index * per) for r, g in refill.sources[self.accelerator.process_index]]
        merged = merge(outputs, mine, group, self.processing_class.pad_token_id)
        merged["num_items_in_batch"] = self.loss_mask_count(merged)
        self._captured = (merge_gathered(rewards, refill, group), merge_gathered(lengths, refill, group))
        if self.log_completions:  # the table shows the batch trained on, not the last round's
            self.set_completion_rows(merge_table(tables, refill, group))
        train = self.metrics("train")
        train["sampling/rounds"].append(float(rounds))
        train["sampling/prompts_drawn"].append(float(rounds * per * processes))
        train["sampling/groups_discarded"].append(float(rounds * per * processes))
        train["sampling/frac_equal_groups_sampled"].append(sum(equal) / len(equal))
        train["sampling/groups_unfilled"].append(float(refill.unfilled))
        return merged

    def scored_batch(self, inputs, output):
        self._batch_inputs = None
        if self._sharing is not None and self.model.training:
            # Rows come in groups of num_generations (TRL's RepeatSampler); the key travels with each row through
            # TRL's shuffle and split into micro-batches.
            self._sharing.new_batch()
            rows = len(output["prompt_ids"])
            output[PROMPT_GROUP] = torch.arange(rows // self.num_generations).repeat_interleave(self.num_generations)
        if self.diagnostics is None and not self.skip_zero_advantage:
            return output
        if self._captured is None:  # TRL changed its call graph: fail loudly rather than log nothing
            raise RuntimeError("RecipeTrainer: TRL's reward step (scored_rewards) was not called while scoring "
                               "completions; re-check grpo_recipes/trl_internals.py")
        rewards_per_func, lengths = self._captured
        self._captured = None
        mode = "train" if self.model.training else "eval"
        group = self.num_generations if mode == "train" else self.num_generations_eval
        if self.skip_zero_advantage and mode == "train":
            # One process (skip_blockers), so the gathered rows are this process's rows. A key of the batch:
            # TRL shuffles and splits it into micro-batches with the advantages.
            equal = equal_reward_groups(rewards_per_func, self.reward_weights, group)
            output[EQUAL_GROUP] = equal.repeat_interleave(group)
        if self.diagnostics is not None:
            advantages = self.accelerator.gather(output["advantages"].detach())
            metrics = batch_diagnostics(rewards_per_func, self.reward_weights, advantages, lengths, group,
                                        self.diagnostics)
            for name, value in metrics.items():
                self.metrics(mode)[name].append(value)
        return output

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        # A row whose group scored alike has advantage 0 in exact arithmetic; TRL's float32 group mean leaves a
        # rounding residue (a few ulps / 1e-4, one sign for the whole group) that is noise, not signal. With beta 0
        # and no entropy bonus (checked at start-up) every loss type is advantage x (a function of the
        # log-probabilities), so such a micro-batch's gradient is zero, or that residue's: its forward and backward
        # (three quarters of a CPU step) are skipped. `per_device_train_batch_size: 1` lets each row skip on its own.
        if self.skip_zero_advantage and self.model.training:
            skip = bool(inputs[EQUAL_GROUP].all())
            self.metrics("train")["frac_rows_skipped"].append(float(skip))  # micro-batches are equal-sized
            if skip:
                # Zero gradients, not none: AdamW passes over a parameter without a gradient, where the full batch
                # would have moved it by its momentum. One pass over the weights, against a forward and backward.
                return sum(p.sum() for p in model.parameters() if p.requires_grad) * 0.0
        if self._sharing is None or not self.model.training:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        self._sharing_group = int(inputs[PROMPT_GROUP][0])  # read by shared_logps
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if self._sharing_group is not None:  # TRL changed its call graph: fail loudly rather than share nothing
            raise RuntimeError("RecipeTrainer: GRPOTrainer's loss no longer asks for the policy's log-probabilities "
                               "(shared_logps); update share_prompt_forward in grpo_recipes/trl_internals.py")
        return loss

    def shared_logps(self, model, input_ids, attention_mask, logits_to_keep, compute_entropy):
        # Only the loss's own call, with gradients: the reference and old-policy passes (no_grad) stay TRL's.
        group, self._sharing_group = self._sharing_group, None
        if group is not None and torch.is_grad_enabled():
            with self.accelerator.autocast():
                shared = self._sharing.row(model, group, input_ids, attention_mask, logits_to_keep, compute_entropy)
            self.metrics("train")["frac_rows_prompt_shared"].append(float(shared is not None))
            if shared is not None:
                return *shared, None
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


def diagnostics_spec(recipe, grpo, funcs) -> DiagnosticsSpec | None:
    if not recipe.diagnostics:
        return None
    names = tuple(f.__name__ for f in funcs)
    return DiagnosticsSpec(
        reward_names=names,
        correctness_index=correctness_index(names, recipe.correctness_reward),
        threshold=recipe.correctness_threshold,
        k=recipe.eval_k or grpo.num_generations,
        normalised=grpo.scale_rewards != "none",
    )
