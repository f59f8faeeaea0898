"""Dynamic sampling and the curriculum (grpo_recipes/grpo/features/sampling.py): a batch whose groups scored alike is refilled with
groups of new prompts, the refill stops at its bound and says so, two processes train on consistent batches, a
resumed run draws the prompts a straight run draws, and the curriculum shelves what the run always or never solves."""

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from types import SimpleNamespace

import pandas as pd
import torch
from helpers import REPO, tiny_run_args

from grpo_recipes.grpo.features import sampling
from grpo_recipes.grpo.features.sampling import PassRates, PromptPool, Refill, merge, merge_gathered

REWARDS = {
    # answer a multiple of 3: completions scored by their length (they differ); any other: 0 (the group is equal)
    "thirds": ("skip_rewards", "test_length_on_multiples_of_three"),
    "constant": ("sampling_rewards", "test_constant"),
}


def _config(run_env, reward: str) -> str:
    folder, name = REWARDS[reward]
    config = run_env / f"{reward}.yaml"
    config.write_text((REPO / "recipes" / "configs" / "math_cpu.yaml").read_text() + f"""
reward_dirs: [{REPO / "tests" / "data" / folder}]
rewards:
  - {{name: {name}, weight: 1.0}}
eval_heldout: false
""")
    return str(config)


def _run(model_dir, run_env, name, reward, *extra, steps=2, launcher=(), env=None):
    out, tracks = run_env / name, run_env / f"trackio_{name}"
    cmd = [sys.executable, *launcher, str(REPO / "recipes" / "math_grpo.py"), "--config", _config(run_env, reward),
           *tiny_run_args(model_dir, out, steps), "--trackio_dir", str(tracks), "--run_name", name,
           "--log_completions", "true", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=run_env, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    with sqlite3.connect(tracks / "grpo-recipes-math.db") as con:
        rows = [json.loads(m) for (m,) in con.execute("SELECT metrics FROM metrics ORDER BY id")]
    return proc, out, [r for r in rows if "train/loss" in r]


# ------------------------------------------------------------------------------------------------- the parts


def test_a_slot_holding_an_equal_group_is_filled_from_the_same_process_in_order():
    refill = Refill.start([True, False, True, True], processes=2)  # process 0: groups 0, 1; process 1: 2, 3
    assert refill.needed == [[0], [0, 1]] and refill.unfilled == 3
    refill.fill(1, [False, False, True, False])  # round 1: process 0 has 2 fresh groups, process 1 one
    assert refill.sources == [[(1, 0), (0, 1)], [(1, 3), (0, 3)]] and refill.unfilled == 1
    refill.fill(2, [True, True, True, True])  # nothing fresh: the slot keeps its equal group
    assert refill.unfilled == 1 and refill.sources[1][1] == (0, 3)
    gathered = [torch.arange(8).view(8, 1), torch.arange(8, 16).view(8, 1), torch.arange(16, 24).view(8, 1)]
    assert merge_gathered(gathered, refill, group=2).flatten().tolist() == [8, 9, 2, 3, 14, 15, 6, 7]


def test_a_group_whose_answers_differ_only_in_format_is_refilled_unless_the_signal_is_the_total_reward():
    # Columns: correctness (0/1), format (0/1) at weights 1 and 0.2; groups of 4. Group 0: all wrong, one unboxed;
    # group 1: one right; group 2: all right and boxed; group 3: all wrong, one unscored (None) row.
    rewards = torch.tensor([[0, 1], [0, 1], [0, 0], [0, 1], [1, 1], [0, 1], [0, 1], [0, 1],
                            [1, 1], [1, 1], [1, 1], [1, 1], [0, 1], [0, 1], [float("nan"), 1], [0, 0]]).float()
    weights = torch.tensor([1.0, 0.2])
    assert sampling.uninformative(rewards, weights, 4, "correctness", 0).tolist() == [True, False, True, True]
    assert sampling.uninformative(rewards, weights, 4, "reward", 0).tolist() == [False, False, True, False]
    # The correctness column is the named one, wherever it sits.
    assert sampling.uninformative(rewards[:, [1, 0]], weights.flip(0), 4, "correctness", 1).tolist() == \
        [True, False, True, True]


def test_merge_keeps_each_rows_tokens_and_pads_prompts_left_completions_right():
    def out(prompt_width, completion_width, base):
        rows = 4
        return {"prompt_ids": torch.full((rows, prompt_width), base), "prompt_mask": torch.ones(rows, prompt_width),
                "completion_ids": torch.full((rows, completion_width), base + 1),
                "completion_mask": torch.ones(rows, completion_width),
                "old_per_token_logps": torch.full((rows, completion_width), -1.0),
                "advantages": torch.arange(rows, dtype=torch.float) + base, "num_items_in_batch": torch.tensor(99)}

    merged = merge([out(2, 3, 10), out(4, 1, 20)], [(1, 1), (0, 0)], group=2, pad_id=0)
    assert merged["prompt_ids"].tolist() == [[20] * 4, [20] * 4, [0, 0, 10, 10], [0, 0, 10, 10]]
    assert merged["prompt_mask"][2].tolist() == [0, 0, 1, 1]
    assert merged["completion_ids"].tolist() == [[21, 0, 0], [21, 0, 0], [11] * 3, [11] * 3]
    assert merged["completion_mask"][0].tolist() == [1, 0, 0]
    assert merged["old_per_token_logps"][0].tolist() == [-1.0, 0.0, 0.0]
    assert merged["advantages"].tolist() == [22.0, 23.0, 10.0, 11.0]
    assert "num_items_in_batch" not in merged  # recounted by the trainer over every process


def test_the_pool_resumes_where_it_stopped_and_reshuffles_each_pass():
    keys = [f"q{i}" for i in range(5)]
    pool = PromptPool(5, seed=3, keys=keys)
    first = pool.draw(3)
    saved = json.loads(json.dumps(pool.state_dict()))
    rest = pool.draw(6)
    again = PromptPool(5, seed=3, keys=keys)
    again.load_state_dict(saved)
    assert again.draw(6) == rest
    assert sorted(first + rest[:2]) == list(range(5))  # one pass is every row once
    assert PromptPool(5, seed=4, keys=keys).draw(5) != PromptPool(5, seed=3, keys=keys).draw(5)


def test_the_curriculum_shelves_the_never_and_always_solved_and_rechecks_some():
    keys = ["hard", "easy", "mid", "new"]
    rates = PassRates()
    rates.update(["hard", "easy", "mid"], [0, 8, 3], group=8)
    pool = PromptPool(4, seed=0, keys=keys, rates=rates, recheck=0.0, min_tried=8)
    assert [pool.shelved(k) for k in keys] == ["hard", "easy", None, None]
    assert sorted(set(pool.draw(40))) == [2, 3]  # never a shelved one without rechecks
    rechecking = PromptPool(4, seed=0, keys=keys, rates=rates, recheck=0.5, min_tried=8)
    drawn = rechecking.draw(400)
    assert {0, 1} <= set(drawn) and drawn.count(0) < drawn.count(2)


def test_settings_that_cannot_work_are_named_with_their_fix():
    recipe = SimpleNamespace(dynamic_sampling=True, curriculum=True, dynamic_sampling_max_rounds=0, curriculum_low=0.5,
                             curriculum_high=0.5, curriculum_recheck=2.0, dynamic_sampling_signal="accuracy")
    args = SimpleNamespace(scale_rewards="batch", multi_objective_aggregation="sum_then_normalize",
                           per_device_train_batch_size=3, steps_per_generation=1, num_generations=2)
    problems = sampling.Sampling.problems(recipe, args)
    assert problems[0] == "dynamic_sampling_signal: 'accuracy'; one of correctness, reward"
    assert problems[1].startswith("dynamic_sampling_max_rounds: 0; at least 1")
    assert problems[2].startswith("curriculum_low, curriculum_high: 0.5, 0.5")
    assert problems[3].startswith("curriculum_recheck: 2; a probability")
    assert problems[4].startswith("dynamic_sampling: scale_rewards batch")
    assert problems[5].startswith("dynamic_sampling: each process's generation batch (3 rows) must hold whole groups")


# ------------------------------------------------------------------------------------------------- in a run


def test_a_batch_of_equal_groups_is_refilled_with_groups_whose_rewards_differ(tiny_model_dir, run_env):
    _, out, logs = _run(tiny_model_dir, run_env, "refill", "thirds", "--dynamic_sampling", "true",
                        "--dynamic_sampling_max_rounds", "8")
    assert all(r["train/sampling/rounds"] >= 1 for r in logs if r["train/sampling/frac_equal_groups_sampled"] > 0)
    assert any(r["train/sampling/frac_equal_groups_sampled"] > 0 for r in logs)
    for r in logs:  # the batch trained on: fewer equal groups than were sampled, none once filled
        assert r["train/diag/frac_equal_groups"] <= r["train/sampling/frac_equal_groups_sampled"]
        if r["train/sampling/groups_unfilled"] == 0:
            assert r["train/diag/frac_equal_groups"] == 0
    assert any(r["train/sampling/groups_unfilled"] == 0 and r["train/sampling/rounds"] > 0 for r in logs)
    # The completions table shows the batch trained on: a filled step's groups each have rewards that differ.
    for path, r in zip(sorted((out / "completions").glob("*.parquet")), logs, strict=True):
        table = pd.read_parquet(path)
        assert len(table) == 8
        if r["train/sampling/groups_unfilled"] == 0:
            scores = table["test_length_on_multiples_of_three"].tolist()
            assert all(len(set(scores[g:g + 4])) > 1 for g in (0, 4)), scores


def test_the_refill_stops_at_its_bound_and_says_so(tiny_model_dir, run_env):
    proc, _, logs = _run(tiny_model_dir, run_env, "bound", "constant", "--dynamic_sampling", "true",
                         "--dynamic_sampling_max_rounds", "2", steps=1)
    [r] = logs
    assert r["train/sampling/rounds"] == 2 and r["train/sampling/groups_unfilled"] == 2  # 2 prompts, both equal
    assert r["train/sampling/prompts_drawn"] == 4 and r["train/sampling/groups_discarded"] == 4
    assert "ALERT Dynamic sampling could not fill the batch" in proc.stderr


def test_two_processes_train_on_consistent_refilled_batches(tiny_model_dir, run_env):
    launcher = ("-m", "accelerate.commands.launch", "--config_file", str(REPO / "accelerate_configs/cpu_ddp.yaml"))
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
    _, out, logs = _run(tiny_model_dir, run_env, "ddp", "thirds", "--dynamic_sampling", "true", "--use_cpu", "true",
                        "--per_device_train_batch_size", "8", launcher=launcher, env=env)
    # Both processes ran the same refill rounds (TRL's collectives would hang otherwise) and logged once.
    assert [r["train/global_step"] for r in logs] == [1, 2]
    assert any(r["train/sampling/rounds"] > 0 for r in logs)
    assert (out / "model.safetensors").is_file()


def test_a_resumed_run_draws_the_prompts_a_straight_run_draws(tiny_model_dir, run_env):
    saving = ("--dynamic_sampling", "true", "--curriculum", "true", "--save_strategy", "steps", "--save_steps", "1",
              "--save_total_limit", "5")
    _, straight, _ = _run(tiny_model_dir, run_env, "straight", "thirds", *saving, steps=3)
    resumed = run_env / "resumed"
    shutil.copytree(straight / "checkpoint-1", resumed / "checkpoint-1")
    saved = json.loads((resumed / "checkpoint-1" / "sampling_state_0.json").read_text())
    assert saved["pool"]["cursor"] > 0 and sum(saved["rates"]["tried"].values()) > 0
    _run(tiny_model_dir, run_env, "resumed", "thirds", *saving, "--resume", steps=3)

    def prompts(out, step):
        table = pd.read_parquet(out / "completions" / f"completions_{step:05d}.parquet")
        return [p[-1]["content"] for p in table["prompt"]]

    for step in (2, 3):
        assert prompts(resumed, step) == prompts(straight, step)
