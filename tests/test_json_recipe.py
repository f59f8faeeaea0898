"""The JSON recipe end to end on the tiny model: its rewards' metrics reach Trackio; and what its rewards pay, on its
own rows, for a record that extracts nothing."""

import collections
import json
import statistics
import subprocess
import sys

import pytest
from helpers import REPO, tiny_run_args, trackio_metrics

from grpo_recipes.config.resolve import resolve
from grpo_recipes.rewards import hacks, registry
from grpo_recipes.tasks.data import load_splits


def test_json_recipe_logs_parse_and_schema_rates(tiny_model_dir, run_env):
    out = run_env / "out"
    args = tiny_run_args(tiny_model_dir, out, 1, "--eval_heldout", "false")
    proc = subprocess.run([sys.executable, str(REPO / "recipes/json_grpo.py"), *args],
                          capture_output=True, text=True, timeout=600, cwd=run_env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = [json.loads(m) for _, m in trackio_metrics(run_env / "trackio", "grpo-recipes-json")]
    train = next(r for r in records if "train/loss" in r)
    for key in ("rewards/json_schema/parse_rate", "rewards/json_schema/schema_valid_rate",
                "rewards/json_field_accuracy/mean", "rewards/json_schema/mean"):
        assert 0.0 <= train[f"train/{key}"] <= 1.0, key


# ---- what a record that extracts nothing earns under the recipe's own rewards, on its own rows (issue 34, item 7)

CONFIG = REPO / "recipes" / "configs" / "json_cpu.yaml"


@pytest.fixture(scope="module")
def recipe_rows_and_rewards():
    config = resolve(["--config", str(CONFIG)])
    recipe = config.recipe
    train, held_out = load_splits(recipe, config.task)
    funcs, _ = registry.compile_rewards(recipe.reward_specs, registry.available())
    return train.to_list(), held_out.to_list(), list(zip(recipe.reward_specs, funcs))


def _totals(rewards, rows: list[dict], texts: list[str]) -> list[float]:
    messages = [[{"role": "assistant", "content": t}] for t in texts]
    context = {"schema": [r["schema"] for r in rows], "gold": [r["gold"] for r in rows],
               "completion_ids": [list(range(len(t) // 4)) for t in texts], "log_metric": lambda *a: None}
    scores = [func(messages, **context) for _, func in rewards]
    return [sum(spec.weight * (s[i] or 0.0) for (spec, _), s in zip(rewards, scores)) for i in range(len(texts))]


def _most_common_record(rows: list[dict]) -> dict[str, dict]:
    """Per domain, each field's most common gold value on the training rows: the best record that reads no text."""
    golds = collections.defaultdict(list)
    for r in rows:
        golds[r["domain"]].append(json.loads(r["gold"]))
    return {d: {k: json.loads(collections.Counter(json.dumps(g[k]) for g in gs).most_common(1)[0][0]) for k in gs[0]}
            for d, gs in golds.items()}


def test_a_schema_valid_placeholder_earns_at_most_a_quarter_of_the_maximum(recipe_rows_and_rewards):
    train, held_out, rewards = recipe_rows_and_rewards
    rows = train + held_out
    # The maximum: both rewards in full (the length penalty is 0 at best), what the gold record earns on every row.
    best = sum(spec.weight for spec, _ in rewards if spec.name in ("json_schema", "json_field_accuracy"))
    gold = _totals(rewards, rows, [f"```json\n{r['gold']}\n```" for r in rows])
    assert gold == [pytest.approx(best)] * len(rows)
    placeholder = next(h for h in hacks.CATALOG if h.name == "placeholder_record")
    texts = [placeholder.make(r, {}) for r in rows]
    schema_scores = registry.available()["json_schema"].func(texts, [r["schema"] for r in rows], lambda *a: None)
    assert schema_scores == [1.0] * len(rows)  # every placeholder is schema-valid: the format reward pays it in full
    totals = _totals(rewards, rows, texts)
    assert statistics.fmean(totals) <= best / 4, statistics.fmean(totals)
    # Where no field matches the gold by chance, the format credit is all it earns, on every such row.
    accuracy = registry.available()["json_field_accuracy"].func(texts, [r["gold"] for r in rows], lambda *a: None)
    assert max(t for t, a in zip(totals, accuracy) if a == 0.0) <= best / 4
    # The strongest placeholder: each field's most common gold value, schema-valid on every row.
    common = _most_common_record(train)
    texts = [json.dumps(common[r["domain"]]) for r in rows]
    assert statistics.fmean(_totals(rewards, rows, texts)) <= best / 4


def test_at_equal_weight_a_placeholder_earns_half(recipe_rows_and_rewards):
    """The test above can fail: with json_schema weighed as json_field_accuracy, a placeholder earns over half."""
    train, held_out, rewards = recipe_rows_and_rewards
    rows = train + held_out
    equal = [(registry.RewardSpec(spec.name, 1.0 if spec.name == "json_schema" else spec.weight, spec.params), func)
             for spec, func in rewards]
    placeholder = next(h for h in hacks.CATALOG if h.name == "placeholder_record")
    totals = _totals(equal, rows, [placeholder.make(r, {}) for r in rows])
    assert statistics.fmean(totals) > 2.0 / 2  # above half of the maximum, 2.0


def test_each_rows_demonstration_earns_the_maximum(recipe_rows_and_rewards):
    """The sft stage imitates the demonstrations: each must be a record the rewards pay in full, in the form the
    prompt asks for, within the length the penalty allows."""
    train, held_out, rewards = recipe_rows_and_rewards
    rows = train + held_out
    best = sum(spec.weight for spec, _ in rewards if spec.name in ("json_schema", "json_field_accuracy"))
    assert all(r["demonstration"].startswith("```json\n") for r in rows)
    assert _totals(rewards, rows, [r["demonstration"] for r in rows]) == [pytest.approx(best)] * len(rows)
