"""GRPO diagnostics for one generation batch, from the rewards and advantages the trainer actually used.

Pure functions over small tensors: no model, no extra forward pass. Inputs are the batch as gathered over all
processes, in TRL's layout: row i*G..(i+1)*G-1 are the G completions of prompt i (G = num_generations), NaN marks a
reward that returned None. Metric names are stable; the trainer logs them under `diag/` (Trackio: `train/diag/...`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

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


def correctness_index(names: list[str] | tuple[str, ...], correctness: str | None) -> int:
    """The correctness reward's column: the named one, or the first reward when none is named."""
    return 0 if correctness is None else list(names).index(correctness)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al. 2021): 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    # The product form avoids the huge binomials: C(n-c, k)/C(n, k) = prod_{i=n-c+1..n} (1 - k/i).
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


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


def total_reward(rewards_per_func: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted sum as TRL computes it: None (NaN) rewards are skipped, a row with no reward at all stays NaN."""
    r = rewards_per_func.detach().double()
    total = (r * weights.detach().double().to(r.device).unsqueeze(0)).nansum(dim=1)
    total[torch.isnan(r).all(dim=1)] = float("nan")
    return total


def equal_reward_groups(rewards_per_func: torch.Tensor, weights: torch.Tensor, group_size: int) -> torch.Tensor:
    """One flag per group: its scored completions all got the same total reward (rows no reward scored are left out,
    as TRL leaves them out of the group mean and gives them advantage 0). Their advantages are zero in exact
    arithmetic, whatever TRL's float32 mean makes of them: eight rewards of 0.2 leave a residue of 1.5e-8 in the
    mean, a std TRL's `frac_reward_zero_std` (isclose, atol 1e-8) counts as a spread."""
    total = total_reward(rewards_per_func, weights).view(-1, group_size)
    scored = ~torch.isnan(total)
    hi = torch.where(scored, total, -math.inf).max(dim=1).values
    lo = torch.where(scored, total, math.inf).min(dim=1).values
    return ((hi == lo) | ~scored.any(dim=1)).to(rewards_per_func.device)


def batch_diagnostics(
    rewards_per_func: torch.Tensor,
    weights: torch.Tensor,
    advantages: torch.Tensor,
    lengths: torch.Tensor,
    group_size: int,
    spec: DiagnosticsSpec,
) -> dict[str, float]:
    """All diagnostics of one generation batch. A metric that is undefined for this batch is absent, not NaN."""
    rows = rewards_per_func.shape[0]
    if rows % group_size or advantages.numel() != rows or lengths.numel() != rows:
        raise ValueError(
            f"diagnostics: {rows} reward rows, {advantages.numel()} advantages, {lengths.numel()} lengths "
            f"do not form groups of {group_size}"
        )
    correctness = rewards_per_func[:, spec.correctness_index]
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
