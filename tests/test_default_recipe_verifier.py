"""The default math recipe's verifier gives 0 to a question copied into the box, on every question of its own data.

The rows come from grpo_recipes.data with recipes/configs/math_cpu.yaml's settings (train and held-out splits), and
the reward is compiled from the config's own `rewards:` entry, as the trainer and the held-out evaluation use it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_recipes import hacks, registry
from grpo_recipes.parsing import parse_recipe_args
from grpo_recipes.data import load_splits

CONFIG = Path(__file__).resolve().parent.parent / "recipes" / "configs" / "math_cpu.yaml"


@pytest.fixture(scope="module")
def setup():
    recipe, *_ = parse_recipe_args(["--config", str(CONFIG)])
    train, held_out = load_splits(recipe)
    correctness = recipe.correctness_reward or recipe.reward_specs[0].metric_name
    spec = next(s for s in recipe.reward_specs if s.metric_name == correctness)
    funcs, _ = registry.compile_rewards([spec], registry.available())
    return spec, funcs[0], train.to_list() + held_out.to_list(), len(held_out)


def _score(reward, rows: list[dict], texts: list[str]) -> list:
    # The trainer hands conversational completions: one assistant message each.
    return reward([[{"role": "assistant", "content": t}] for t in texts], answer=[r["answer"] for r in rows],
                  log_metric=lambda *a: None)


COPIES = {
    "boxed": "\\boxed{{{e}}}",
    "parenthesised": "\\boxed{{({e})}}",
    "dollars": "The final answer is ${e}$.",
    "anchor": "The final answer is {e}",
    "restated": "To solve for \\boxed{{{e}}} we add the numbers.",
    "whole question": "\\boxed{{{q}}}",
    "work shown": "\\boxed{{{e} = ?}}",
}


def test_the_default_uses_the_literal_answer_form(setup):
    spec, _, rows, held_out = setup
    assert spec.name == "math_correctness" and spec.params["answer_form"] == "literal"
    assert len(rows) >= 1000 and held_out >= 50


@pytest.mark.parametrize("form", sorted(COPIES))
def test_a_copied_question_scores_zero_on_every_row(setup, form):
    _, reward, rows, _ = setup
    expressions = [hacks.question_expression(r["question"]) for r in rows]
    assert all(expressions), [r["question"] for r, e in zip(rows, expressions) if not e][:3]
    texts = [COPIES[form].format(e=e, q=r["question"]) for r, e in zip(rows, expressions)]
    scores = _score(reward, rows, texts)
    paid = [(t, r["answer"]) for t, r, s in zip(texts, rows, scores) if s != 0.0]
    assert not paid, f"{len(paid)} of {len(rows)} copies paid, e.g. {paid[:3]}"


def test_the_gold_in_a_box_scores_one_on_every_row(setup):
    _, reward, rows, _ = setup
    scores = _score(reward, rows, [f"So the answer is \\boxed{{{r['answer']}}}." for r in rows])
    assert scores == [1.0] * len(rows)


def test_with_the_expression_form_the_same_copies_would_pay(setup):
    """The test above can fail: the answer form is what stops the copy, not the rows."""
    spec, _, rows, held_out = setup
    expression = registry.RewardSpec(spec.name, spec.weight, {**spec.params, "answer_form": "expression"})
    funcs, _ = registry.compile_rewards([expression], registry.available())
    rows = rows[-held_out:]
    texts = [COPIES["boxed"].format(e=hacks.question_expression(r["question"])) for r in rows]
    assert _score(funcs[0], rows, texts) == [1.0] * len(rows)
