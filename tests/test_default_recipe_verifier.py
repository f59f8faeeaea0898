"""The default math recipe's rewards on every question of its own data: a question copied into the box, and the hacks
of issue 34 (working that contradicts the answer, empty-looking boxes, hedges outside a box, negations, superscript
digits) earn no correctness and the empty boxes no format credit; every worked solution earns full marks.

The rows come from grpo_recipes.tasks.data with recipes/configs/math_cpu.yaml's settings (train and held-out splits), and
the rewards are compiled from the recipe's own reward specs (the arithmetic task's defaults), as the trainer and the
held-out evaluation use them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_recipes.config.resolve import resolve
from grpo_recipes.rewards import hacks, registry
from grpo_recipes.tasks.data import load_splits

CONFIG = Path(__file__).resolve().parent.parent / "recipes" / "configs" / "math_cpu.yaml"


@pytest.fixture(scope="module")
def setup():
    config = resolve(["--config", str(CONFIG)])
    recipe = config.recipe
    train, held_out = load_splits(recipe, config.task)
    correctness = recipe.correctness_reward or recipe.reward_specs[0].metric_name
    spec = next(s for s in recipe.reward_specs if s.metric_name == correctness)
    funcs, _ = registry.compile_rewards([spec], registry.available())
    return spec, funcs[0], train.to_list() + held_out.to_list(), len(held_out)


@pytest.fixture(scope="module")
def recipe_rewards(setup):
    """(spec, compiled reward) for every reward the recipe trains on."""
    config = resolve(["--config", str(CONFIG)])
    recipe = config.recipe
    funcs, _ = registry.compile_rewards(recipe.reward_specs, registry.available())
    return list(zip(recipe.reward_specs, funcs))


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


def _by_reward(recipe_rewards, rows: list[dict], texts: list[str]) -> dict[str, list]:
    return {spec.metric_name: _score(func, rows, texts) for spec, func in recipe_rewards}


def _total(recipe_rewards, rows: list[dict], texts: list[str]) -> list[float]:
    scores = _by_reward(recipe_rewards, rows, texts)
    return [sum(spec.weight * (scores[spec.metric_name][i] or 0.0) for spec, _ in recipe_rewards)
            for i in range(len(texts))]


def test_the_default_reads_the_working_and_pays_format_only_for_a_number(recipe_rewards):
    params = {spec.name: spec.params for spec, _ in recipe_rewards}
    assert params == {"math_correctness": {"answer_form": "literal", "check_working": True, "check_equations": True},
                      "boxed_format": {"numeric": True}}
    assert [spec.weight for spec, _ in recipe_rewards] == [1.0, 0.2]


def test_every_worked_solution_scores_full_marks(setup, recipe_rewards):
    _, _, rows, _ = setup
    solved = [r for r in rows if r.get("worked_solution")]
    assert len(solved) >= 0.9 * len(rows)
    totals = _total(recipe_rewards, solved, [r["worked_solution"] for r in solved])
    missed = [(r["worked_solution"], t) for r, t in zip(solved, totals) if t != pytest.approx(1.2)]
    assert not missed, f"{len(missed)} of {len(solved)} worked solutions missed full marks, e.g. {missed[:3]}"
    # The few-shot example's format, with a negative result.
    assert _total(recipe_rewards, [{"answer": "-3"}], ["-7 + 4 = -3. \\boxed{-3}"]) == [pytest.approx(1.2)]


def _wrong(gold: str) -> str:
    return str(int(gold) + 1)


SUPERSCRIPTS = "⁰¹²³⁴⁵⁶⁷⁸⁹"
# Issue 34, items 1-5: each a completion built from the row's gold g (w: a wrong number), paid 1.0 before.
ISSUE34 = {
    "false working": lambda g: f"{g} + 1 = {g}. \\boxed{{{g}}}",
    "true working about other numbers": lambda g: f"1 + 1 = 2. \\boxed{{{g}}}" if g != "2" else "1 + 2 = 3. \\boxed{2}",
    "a false equation, then a true one": lambda g: f"{g} + 1 = {g}. So {g} = {g}. \\boxed{{{g}}}",
    "hedge in dollars": lambda g: f"The final answer is ${g}$ or ${_wrong(g)}$.",
    "hedge in \\(...\\)": lambda g: f"The final answer is \\({g}\\) or \\({_wrong(g)}\\).",
    "hedge as a list": lambda g: f"The final answer is ${g}$, ${_wrong(g)}$.",
    "hedge with a braceless box": lambda g: f"\\boxed{{{g}}} or \\boxed {_wrong(g)}",
    "hedge with a framebox": lambda g: f"\\boxed{{{g}}} or \\framebox{{{_wrong(g)}}}",
    "never": lambda g: f"The answer is never {g}.",
    "no": lambda g: f"The answer is no {g}.",
    "is wrong": lambda g: f"\\boxed{{{g} \\text{{ is wrong}}}}",
    "superscript digit": lambda g: f"\\boxed{{{g[:-1]}{SUPERSCRIPTS[int(g[-1])]}}}" if abs(int(g)) > 9 else None,
}
EMPTY_BOXES = ["So \\boxed{{}}.", "So \\boxed{\\text{}}.", "So \\boxed{\u200b}.", "So \\boxed{\\phantom{0}}.",
               "So \\boxed{B}."]


@pytest.mark.parametrize("form", sorted(ISSUE34))
def test_issue34_hacks_earn_no_correctness_on_every_row(setup, recipe_rewards, form):
    _, _, rows, _ = setup
    made = [(r, ISSUE34[form](str(r["answer"]))) for r in rows]
    made = [(r, t) for r, t in made if t is not None]
    assert len(made) >= 100, form  # every form is tried on many rows (superscripts: two-digit golds only)
    scores = _by_reward(recipe_rewards, [r for r, _ in made], [t for _, t in made])["math_correctness"]
    paid = [(t, r["answer"]) for (r, t), s in zip(made, scores) if s != 0.0]
    assert not paid, f"{len(paid)} of {len(made)} paid, e.g. {paid[:3]}"


def test_issue34_empty_looking_boxes_earn_no_format_credit_on_every_row(setup, recipe_rewards):
    _, _, rows, _ = setup
    for text in EMPTY_BOXES:
        totals = _total(recipe_rewards, rows, [text] * len(rows))
        assert totals == [0.0] * len(rows), text


def test_without_these_settings_the_same_hacks_pay(setup):
    """The tests above can fail: math_correctness with only answer_form literal pays the working hacks, and
    boxed_format without numeric pays \\boxed{B}."""
    _, _, rows, _ = setup
    plain = registry.compile_rewards([registry.RewardSpec("math_correctness", 1.0, {"answer_form": "literal"}),
                                      registry.RewardSpec("boxed_format", 0.2, {})], registry.available())[0]
    rows = rows[:50]
    texts = [ISSUE34["false working"](str(r["answer"])) for r in rows]
    assert _score(plain[0], rows, texts) == [1.0] * len(rows)
    assert _score(plain[1], rows, ["So \\boxed{B}."] * len(rows)) == [1.0] * len(rows)
