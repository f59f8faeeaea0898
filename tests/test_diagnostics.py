"""Diagnostics of one generation batch: pass@k, TRL's advantages, solve buckets, None rates, correlation."""

import itertools
import math

import pytest
import torch

from grpo_recipes.config.checks import reward_setting_problems
from grpo_recipes.config.schema import RecipeArguments
from grpo_recipes.grpo.features.diagnostics import (
    DiagnosticsSpec,
    advantage_stats,
    batch_diagnostics,
    group_pass_at,
    none_rates,
    pearson,
    solve_buckets,
    zero_tolerance,
)
from grpo_recipes.grpo.groups import pass_at_k

NAN = float("nan")


def trl_advantages(rewards_per_func, weights, group):
    """GRPOTrainer's sum_then_normalize / scale_rewards=group advantages, as in trl 1.16 (float32)."""
    from trl.trainer.utils import nanstd

    rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)
    rewards[torch.isnan(rewards_per_func).all(dim=1)] = NAN
    mean = torch.nanmean(rewards.view(-1, group), dim=1).repeat_interleave(group)
    std = nanstd(rewards.view(-1, group), dim=1).repeat_interleave(group)
    return torch.nan_to_num((rewards - mean) / (std + 1e-4), nan=0.0)


def brute_pass_at_k(n, c, k):
    """Probability that a random k-subset of n samples (c correct) holds a correct one, by enumeration."""
    samples = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 4, 5, 8])
def test_pass_at_k_is_the_unbiased_estimator(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(n, c, k), abs=1e-12), (n, c, k)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - math.comb(3, 2) / math.comb(5, 2))


@pytest.mark.parametrize("args", [(4, 5, 1), (4, 1, 0), (4, 1, 5), (4, -1, 1)])
def test_pass_at_k_rejects_impossible_counts(args):
    with pytest.raises(ValueError):
        pass_at_k(*args)


def test_zero_advantages_of_equal_reward_groups_count_as_zero_and_real_ones_do_not():
    # Group 0: all 1.2 (float32 rounding leaves ~1e-3 "zeros"); group 1: real spread; group 2: all 0.
    rewards = torch.tensor([[1.2]] * 8 + [[1.0], [0.0], [0.0], [0.0], [0.0], [0.0], [0.0], [0.0]] + [[0.0]] * 8)
    weights = torch.tensor([1.0])
    adv = trl_advantages(rewards, weights, 8)
    stats = advantage_stats(adv, zero_tolerance(1.2, normalised=True))
    assert stats["diag/adv_zero_frac"] == pytest.approx(16 / 24)
    assert stats["diag/adv_mean"] == pytest.approx(adv.double().mean().item())
    assert stats["diag/adv_abs_mean"] == pytest.approx(adv.double().abs().mean().item())
    assert stats["diag/adv_std"] == pytest.approx(adv.double().std(unbiased=False).item())
    # float32 rounding leaves group 0's "zeros" non-zero: without the tolerance they would count as signal.
    assert (adv[:8] != 0).all() and advantage_stats(adv)["diag/adv_zero_frac"] == pytest.approx(8 / 24)


def test_zero_tolerance_stays_below_real_advantages_across_reward_scales():
    torch.manual_seed(0)
    for scale in (0.2, 1.0, 10.0):
        for group in (4, 8, 16):
            equal = torch.full((group, 1), scale * torch.rand(1).item() + scale)
            spread = torch.zeros(group, 1)
            spread[0] = scale
            adv = trl_advantages(torch.cat([equal, spread]), torch.tensor([1.0]), group)
            tol = zero_tolerance(2 * scale, normalised=True)
            assert adv[:group].abs().max() <= tol
            assert adv[group:].abs().min() > tol


def test_solve_buckets_count_groups_and_skip_unscorable_ones():
    c = torch.tensor([1, 1, 1, 1, 0, 0, 0, 0, 1, 0, NAN, 0, NAN, NAN, NAN, NAN])
    assert solve_buckets(c, 4, 1.0) == {"diag/solve_all": 1 / 3, "diag/solve_none": 1 / 3, "diag/solve_mixed": 1 / 3}
    # A partial score below the threshold is not a solve.
    assert solve_buckets(torch.tensor([0.5, 0.5]), 2, 1.0)["diag/solve_none"] == 1.0
    assert solve_buckets(torch.tensor([NAN, NAN]), 2, 1.0) == {}


def test_group_pass_at_uses_scored_completions_only():
    c = torch.tensor([1, 0, 0, 0, 1, 1, NAN, NAN])
    out = group_pass_at(c, 4, 1.0, k=2)
    assert out["diag/pass@1"] == pytest.approx((0.25 + 1.0) / 2)
    assert out["diag/pass@k"] == pytest.approx(pass_at_k(4, 1, 2) / 1 * 0.5 + pass_at_k(2, 2, 2) * 0.5)
    only_short = group_pass_at(torch.tensor([1, NAN, NAN, NAN]), 4, 1.0, k=2)
    assert "diag/pass@k" not in only_short and only_short["diag/pass@1"] == 1.0


def test_none_rates_per_reward():
    r = torch.tensor([[1.0, NAN], [NAN, NAN], [0.0, 1.0], [1.0, 1.0]])
    assert none_rates(r, ["a", "b"]) == {"diag/none_rate/a": 0.25, "diag/none_rate/b": 0.5}


def test_pearson_matches_numpy_and_is_undefined_for_constants():
    import numpy as np

    x = torch.tensor([1.0, 2.0, 0.5, 3.0, NAN])
    y = torch.tensor([10.0, 12.0, 8.0, 20.0, 1.0])
    assert pearson(x, y) == pytest.approx(np.corrcoef([1, 2, 0.5, 3], [10, 12, 8, 20])[0, 1])
    assert pearson(torch.ones(4), torch.arange(4.0)) is None
    assert pearson(torch.tensor([1.0]), torch.tensor([2.0])) is None


def test_batch_diagnostics_of_a_trl_batch():
    # 2 prompts x 4 completions; rewards: correctness, format (weight 0.2). Second group's correctness is all 1.
    r = torch.tensor([[1, 1], [0, 1], [0, 0], [0, 1], [1, 1], [1, 1], [1, 1], [1, 0]], dtype=torch.float32)
    w = torch.tensor([1.0, 0.2])
    adv = trl_advantages(r, w, 4)
    lengths = torch.tensor([10, 12, 40, 14, 9, 11, 10, 30])
    spec = DiagnosticsSpec(reward_names=("math_correctness", "boxed_format"), correctness_index=0, k=8)
    out = batch_diagnostics(r, w, adv, lengths, 4, spec)
    assert out["diag/solve_all"] == 0.5 and out["diag/solve_mixed"] == 0.5 and out["diag/solve_none"] == 0.0
    assert out["diag/pass@1"] == pytest.approx((0.25 + 1.0) / 2)
    assert out["diag/pass@k"] == 1.0  # k capped at the group size: each group has a solve
    total = (r * w).sum(dim=1)
    assert out["diag/reward_length_corr"] == pytest.approx(pearson(total, lengths.double()))
    assert out["diag/reward_length_corr"] < 0  # the long completions are the wrong ones
    assert out["diag/none_rate/boxed_format"] == 0.0
    assert out["diag/adv_zero_frac"] == 0.0  # both groups have spread in the total reward
    constant = batch_diagnostics(r, w, adv, torch.full((8,), 7), 4, spec)
    assert "diag/reward_length_corr" not in constant  # undefined is absent, not a made-up 0
    with pytest.raises(ValueError, match="groups of 3"):
        batch_diagnostics(r, w, adv, lengths, 3, spec)


def test_config_problems_name_the_field():
    ok = RecipeArguments(rewards=[{"name": "math_correctness"}, {"name": "boxed_format"}], format_reward="boxed_format")
    assert reward_setting_problems(ok) == []
    bad = RecipeArguments(rewards=[{"name": "math_correctness"}], correctness_reward="nope", eval_k=-1,
                          eval_every_steps=-1)
    text = "\n".join(reward_setting_problems(bad))
    for field in ("correctness_reward: 'nope' is not one of the configured rewards (math_correctness)", "eval_k",
                  "eval_every_steps"):
        assert field in text
    same = RecipeArguments(rewards=[{"name": "math_correctness"}], format_reward="math_correctness")
    assert reward_setting_problems(same) == ["format_reward: must differ from the correctness reward"]


def test_a_demonstrated_row_counts_as_the_unsolved_sample_it_replaced():
    """Demonstrations (features/demonstrations.py) put a correct completion last in every group the policy did not
    solve: the solve rates and pass@k read the policy's own samples, the rest the batch trained on."""
    spec = DiagnosticsSpec(reward_names=("correct",), correctness_index=0, k=2, normalised=True)
    rewards = torch.tensor([[0.0], [0.0], [0.0], [1.0], [1.0], [0.0], [0.0], [1.0]])  # rows 3 and 7: demonstrations
    demonstrated = torch.tensor([False, False, False, True, False, False, False, True])
    advantages, lengths = torch.zeros(8), torch.arange(8.0)
    trained = batch_diagnostics(rewards, torch.ones(1), advantages, lengths, 4, spec)
    policy = batch_diagnostics(rewards, torch.ones(1), advantages, lengths, 4, spec, demonstrated)
    assert trained["diag/pass@1"] == pytest.approx(0.375) and trained["diag/solve_none"] == 0.0
    assert policy["diag/pass@1"] == pytest.approx(0.125)  # the second group's first row, its own sample
    assert (policy["diag/solve_none"], policy["diag/solve_mixed"]) == (0.5, 0.5)
    assert policy["diag/frac_equal_groups"] == trained["diag/frac_equal_groups"]  # the batch trained on
