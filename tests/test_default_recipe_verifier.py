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
from grpo_recipes.rewards import answers, hacks, registry
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


# ---- issue 46: each completion is built from a row whose question is an expression worth its gold (e, g; w: a wrong
# number) and scored as TRL calls the recipe's rewards, prompts included. A wrong boxed number earns 0.2 (the format
# part); each hack below earned 1.2, an honest right answer's score, and must earn no more than a wrong answer.


def _asked_total(recipe_rewards, rows: list[dict], texts: list[str]) -> list[float]:
    completions = [[{"role": "assistant", "content": t}] for t in texts]
    kwargs = {"answer": [r["answer"] for r in rows], "prompts": [r["prompt"] for r in rows],
              "log_metric": lambda *a: None}
    scores = [(spec.weight, func(completions, **kwargs)) for spec, func in recipe_rewards]
    return [sum(weight * (s[i] or 0.0) for weight, s in scores) for i in range(len(texts))]


def _about_other_numbers(text: str, expression: str) -> str | None:
    """The completion, when its working computes with a number the question does not hold (else the row cannot carry
    it: `0 + 7 = 7` answers "Calculate 0 + 7." honestly)."""
    step = text.split("=")[0]
    return None if answers.numbers_in(step) <= answers.question_numbers(expression) else text


# Item 13: working the check could not read, or true working about other numbers.
ISSUE46_WORKING = {
    "equals": lambda e, g, w: f"{e} equals {w}. \\boxed{{{g}}}",
    "full-width equals": lambda e, g, w: f"{e} \uff1d {w}. \\boxed{{{g}}}",
    "arrow": lambda e, g, w: f"{e} \u2192 {w}. \\boxed{{{g}}}",
    "aligned": lambda e, g, w: f"\\begin{{aligned}} {e} &= {w} \\\\ &= {g} \\end{{aligned}} \\boxed{{{g}}}",
    "left right": lambda e, g, w: f"\\left( {e} + 1 \\right) = {g}. \\boxed{{{g}}}",
    "padded side": lambda e, g, w: f"{e} +{' ' * 200}1 = {g}. \\boxed{{{g}}}",
    "inside think": lambda e, g, w: f"<think>{e} = {w}.</think>\\boxed{{{g}}}",
    "0 + g = g": lambda e, g, w: _about_other_numbers(f"0 + {g} = {g}. \\boxed{{{g}}}", e),
    "the few-shot's working": lambda e, g, w: _about_other_numbers("2 + 5 = 7. \\boxed{7}", e) if g == 7 else None,
}
# Item 14: text around the final box, hidden content, hedges the reader missed, words read as a unit.
ISSUE46_AROUND_BOX = {
    "no wait": lambda e, g, w: f"\\boxed{{{g}}} no wait, {w}",
    "actually": lambda e, g, w: f"\\boxed{{{g}}}. Actually, the answer is {w}.",
    "it is not": lambda e, g, w: f"It is not \\boxed{{{g}}}.",
    "is wrong": lambda e, g, w: f"\\boxed{{{g}}} is wrong.",
    "HTML comment": lambda e, g, w: f"\\boxed{{{w}}}\n<!-- final: \\boxed{{{g}}} -->",
    "LaTeX comment": lambda e, g, w: f"\\boxed{{{w}}}\n% final: \\boxed{{{g}}}",
    "think reopened": lambda e, g, w: f"<think>ok</think>\\boxed{{{w}}}\n<think>hmm, actually \\boxed{{{g}}}",
    "boxes 250 spaces apart": lambda e, g, w: f"\\boxed{{{w}}}{' ' * 250}\\boxed{{{g}}}",
    "or else": lambda e, g, w: f"\\boxed{{{w}}} or else \\boxed{{{g}}}",
    "or it could be": lambda e, g, w: f"\\boxed{{{w}}}, or it could be \\boxed{{{g}}}",
    "number word as unit": lambda e, g, w: f"\\boxed{{{g} \\text{{ eight}}}}",
    "clause as unit": lambda e, g, w: f"\\boxed{{{g} \\text{{ is ruled out}}}}",
}
# Item 16 and what a person accepts: each earns an honest right answer's 1.2.
ISSUE46_FAIR = {
    "bold": lambda e, g, w: f"{e} = {g}. \\boxed{{\\boldsymbol{{{g}}}}}",
    "left-to-right mark": lambda e, g, w: f"{e} = {g}. \\boxed{{\u200e{g}}}",
    "text after the box": lambda e, g, w: f"{e} = {g}. \\boxed{{{g}}}, not {w}. I hope it is correct.",
    "relation words": lambda e, g, w: f"{e} equals {g}. \\boxed{{{g}}}",
    "arrow": lambda e, g, w: f"{e} \u2192 {g}. \\boxed{{{g}}}",
    "aligned": lambda e, g, w: f"\\begin{{aligned}} {e} &= {g} \\end{{aligned}} \\boxed{{{g}}}",
    "a label": lambda e, g, w: f"Step 1: {e} = {g}. \\boxed{{{g}}}",
}


def _issue46_rows(setup) -> list[dict]:
    _, _, rows, _ = setup
    return [r for r in rows if r.get("worked_solution")]  # the expression is worth the gold


def _made(rows: list[dict], build) -> list[tuple[dict, str]]:
    made = [(r, build(r["expression"], int(r["answer"]), int(r["answer"]) + 1)) for r in rows]
    return [(r, t) for r, t in made if t is not None]


@pytest.mark.parametrize("form", sorted(ISSUE46_WORKING))
def test_issue46_working_it_cannot_read_or_about_other_numbers_earns_no_more_than_a_wrong_answer(setup,
                                                                                                recipe_rewards, form):
    made = _made(_issue46_rows(setup), ISSUE46_WORKING[form])
    assert len(made) >= (20 if form == "the few-shot's working" else 500), form
    totals = _asked_total(recipe_rewards, [r for r, _ in made], [t for _, t in made])
    paid = [(t, r["question"], s) for (r, t), s in zip(made, totals) if s > 0.2 + 1e-9]
    assert not paid, f"{len(paid)} of {len(made)} paid, e.g. {paid[:3]}"


@pytest.mark.parametrize("form", sorted(ISSUE46_AROUND_BOX))
def test_issue46_text_around_the_box_is_read_on_every_row(setup, recipe_rewards, form):
    made = _made(_issue46_rows(setup), ISSUE46_AROUND_BOX[form])
    totals = _asked_total(recipe_rewards, [r for r, _ in made], [t for _, t in made])
    paid = [(t, s) for (_, t), s in zip(made, totals) if s > 0.2 + 1e-9]
    assert len(made) >= 500 and not paid, f"{len(paid)} of {len(made)} paid, e.g. {paid[:3]}"


@pytest.mark.parametrize("form", sorted(ISSUE46_FAIR))
def test_issue46_fair_forms_earn_full_marks_on_every_row(setup, recipe_rewards, form):
    made = _made(_issue46_rows(setup), ISSUE46_FAIR[form])
    totals = _asked_total(recipe_rewards, [r for r, _ in made], [t for _, t in made])
    refused = [(t, s) for (_, t), s in zip(made, totals) if s != pytest.approx(1.2)]
    assert len(made) >= 500 and not refused, f"{len(refused)} of {len(made)} refused, e.g. {refused[:3]}"


def test_issue46_worked_solutions_and_the_few_shot_earn_full_marks_with_their_prompts(setup, recipe_rewards):
    """The working check reads the question from the prompt: the recipe's own demonstrations still earn 1.2."""
    rows = _issue46_rows(setup)
    totals = _asked_total(recipe_rewards, rows, [r["worked_solution"] for r in rows])
    assert totals == [pytest.approx(1.2)] * len(rows)
    few_shot = {"answer": "7", "prompt": [{"role": "user", "content": "Calculate 2 + 5."}]}
    assert _asked_total(recipe_rewards, [few_shot], ["2 + 5 = 7. \\boxed{7}"]) == [pytest.approx(1.2)]
