"""A generation batch in TRL's layout read as groups, for the features and the held-out evaluation: row i*G..(i+1)*G-1
are the G completions of prompt i (G = num_generations), NaN marks a reward that returned None. Pure functions over
small tensors."""

from __future__ import annotations

import math

import torch


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
