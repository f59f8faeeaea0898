"""GRPO diagnostics for every generation batch (recipe `diagnostics`), from the rewards and advantages the trainer
actually used: the metrics (diag/*) and the feature that logs them.

Pure functions over small tensors: no model, no extra forward pass. Inputs are the batch as gathered over all
processes, in TRL's layout (groups.py). Metric names are stable; the trainer logs them under `diag/` (Trackio:
`train/diag/...`).

How the numbers are captured: RecipeTrainer keeps TRL's own reward step's result, already gathered over all
processes, with the completion lengths (gathered the same way, so rows line up); `scored_batch` receives this
process's slice of the advantages TRL computed, and gathering them gives the whole batch in the same row order as the
rewards (TRL itself slices by process index). The diagnostics are appended to `metrics(mode)`, next to TRL's `reward`
and `frac_reward_zero_std`, so TRL's `log()` averages them over the logging window and every `report_to` backend
receives them. A generation batch can serve several optimiser steps (steps_per_generation, num_iterations): its
diagnostics are recorded once, when it is generated, exactly like TRL's reward metrics, and appear in the next log."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..groups import correctness_index, equal_reward_groups, pass_at_k, total_reward
from .base import TrainerFeature

# TRL divides (reward - group mean) by (std + 1e-4). For a group of equal rewards the float32 mean can be off by a few
# ulps of the reward, so an advantage that is zero in exact arithmetic comes out as (a few ulps) / 1e-4: up to ~0.014
# for rewards of 10. Anything within 8 ulps / 1e-4 counts as zero; real advantages are ~0.1 and up.
_F32_ULP = torch.finfo(torch.float32).eps
_STD_EPS = 1e-4


@dataclass(frozen=True)
class DiagnosticsSpec:
    """Which reward column says "solved", and how to read it."""

    reward_names: tuple[str, ...]
    correctness_index: int
    threshold: float = 1.0  # a completion is solved when its correctness reward is at least this
    k: int = 4  # pass@k, capped at the group size
    normalised: bool = True  # advantages divided by a std (TRL scale_rewards != "none")


def zero_tolerance(max_abs_reward: float, normalised: bool) -> float:
    """|advantage| at or below this is zero up to TRL's float32 rounding of the group mean."""
    ulps = 8 * _F32_ULP * max_abs_reward
    return ulps / _STD_EPS if normalised else ulps


def advantage_stats(advantages: torch.Tensor, zero_tol: float = 0.0) -> dict[str, float]:
    a = advantages.detach().double().flatten()
    return {
        "diag/adv_mean": a.mean().item(),
        "diag/adv_std": a.std(unbiased=False).item(),
        "diag/adv_abs_mean": a.abs().mean().item(),
        "diag/adv_zero_frac": (a.abs() <= zero_tol).double().mean().item(),
    }


def _group_counts(correctness: torch.Tensor, group_size: int, threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (scored, solved) per group: completions with a correctness value, and those at or above threshold."""
    grouped = correctness.detach().double().view(-1, group_size)
    scored = ~torch.isnan(grouped)
    solved = scored & (grouped >= threshold)
    return scored.sum(dim=1), solved.sum(dim=1)


def solve_buckets(correctness: torch.Tensor, group_size: int, threshold: float) -> dict[str, float]:
    """Share of prompt groups solved by all / none / some of their completions. Groups with no score are left out."""
    scored, solved = _group_counts(correctness, group_size, threshold)
    keep = scored > 0
    if not keep.any():
        return {}
    scored, solved = scored[keep], solved[keep]
    n = float(keep.sum())
    return {
        "diag/solve_all": (solved == scored).sum().item() / n,
        "diag/solve_none": (solved == 0).sum().item() / n,
        "diag/solve_mixed": ((solved > 0) & (solved < scored)).sum().item() / n,
    }


def group_pass_at(correctness: torch.Tensor, group_size: int, threshold: float, k: int) -> dict[str, float]:
    """pass@1 and pass@k estimated from the groups; a group with fewer than k scored completions gives no pass@k."""
    scored, solved = _group_counts(correctness, group_size, threshold)
    out = {}
    p1 = [pass_at_k(int(n), int(c), 1) for n, c in zip(scored, solved) if n >= 1]
    if p1:
        out["diag/pass@1"] = sum(p1) / len(p1)
    pk = [pass_at_k(int(n), int(c), k) for n, c in zip(scored, solved) if n >= k]
    if pk:
        out["diag/pass@k"] = sum(pk) / len(pk)
    return out


def none_rates(rewards_per_func: torch.Tensor, names: tuple[str, ...] | list[str]) -> dict[str, float]:
    nan = torch.isnan(rewards_per_func.detach()).double().mean(dim=0)
    return {f"diag/none_rate/{name}": nan[i].item() for i, name in enumerate(names)}


def pearson(x: torch.Tensor, y: torch.Tensor) -> float | None:
    """Pearson correlation over rows where both are finite; None when undefined (fewer than 2 rows, a constant)."""
    x, y = x.detach().double().flatten(), y.detach().double().flatten()
    ok = torch.isfinite(x) & torch.isfinite(y)
    x, y = x[ok], y[ok]
    if x.numel() < 2:
        return None
    dx, dy = x - x.mean(), y - y.mean()
    denom = math.sqrt(float((dx * dx).sum()) * float((dy * dy).sum()))
    if denom == 0.0:
        return None
    return float((dx * dy).sum()) / denom


def batch_diagnostics(
    rewards_per_func: torch.Tensor,
    weights: torch.Tensor,
    advantages: torch.Tensor,
    lengths: torch.Tensor,
    group_size: int,
    spec: DiagnosticsSpec,
    demonstrated: torch.Tensor | None = None,
) -> dict[str, float]:
    """All diagnostics of one generation batch. A metric that is undefined for this batch is absent, not NaN.
    `demonstrated`: rows whose sampled completion a demonstration replaced; the solve rates and pass@k are the
    policy's, so such a row counts as the unsolved sample it was (the rest describe the batch trained on)."""
    rows = rewards_per_func.shape[0]
    if rows % group_size or advantages.numel() != rows or lengths.numel() != rows:
        raise ValueError(
            f"diagnostics: {rows} reward rows, {advantages.numel()} advantages, {lengths.numel()} lengths "
            f"do not form groups of {group_size}"
        )
    correctness = rewards_per_func[:, spec.correctness_index]
    if demonstrated is not None:
        correctness = correctness.masked_fill(demonstrated.to(correctness.device), -math.inf)
    total = total_reward(rewards_per_func, weights)
    finite = total[torch.isfinite(total)]
    max_abs = float(finite.abs().max()) if finite.numel() else 0.0
    out = advantage_stats(advantages, zero_tolerance(max_abs, spec.normalised))
    out["diag/frac_equal_groups"] = equal_reward_groups(rewards_per_func, weights, group_size).double().mean().item()
    out.update(solve_buckets(correctness, group_size, spec.threshold))
    out.update(group_pass_at(correctness, group_size, spec.threshold, min(spec.k, group_size)))
    out.update(none_rates(rewards_per_func, spec.reward_names))
    corr = pearson(total, lengths)
    if corr is not None:
        out["diag/reward_length_corr"] = corr
    return out


class Diagnostics(TrainerFeature):
    reads_rewards = reads_lengths = True

    def __init__(self, spec: DiagnosticsSpec):
        self.spec = spec

    @classmethod
    def from_recipe(cls, recipe, training, reward_names):
        if not recipe.diagnostics:
            return None
        names = tuple(reward_names)
        return cls(DiagnosticsSpec(
            reward_names=names,
            correctness_index=correctness_index(names, recipe.correctness_reward),
            threshold=recipe.correctness_threshold,
            k=recipe.eval_k or training.num_generations,
            normalised=training.scale_rewards != "none",
        ))

    def scored_batch(self, trainer, inputs, output: dict) -> dict:
        rewards_per_func, lengths = trainer.captured_rewards()
        mode = "train" if trainer.model.training else "eval"
        group = trainer.num_generations if mode == "train" else trainer.num_generations_eval
        advantages = trainer.accelerator.gather(output["advantages"].detach())
        metrics = batch_diagnostics(rewards_per_func, trainer.reward_weights, advantages, lengths, group, self.spec,
                                    trainer.demonstrated)
        for name, value in metrics.items():
            trainer.metrics(mode)[name].append(value)
        return output
