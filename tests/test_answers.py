"""grpo_recipes/answers.py: where the final answer is, and what a number literal is (shared by the answer rewards)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from grpo_recipes import answers


@pytest.mark.parametrize("text, expected", [
    ("So \\boxed{3}.", ("3",)),
    ("\\boxed{5}. Wait, that is wrong. \\boxed{3}", ("3",)),       # a correction: earlier boxes are drafts
    ("\\boxed{5} or \\boxed{3}", ("5", "3")),                       # joined by a connector: one final answer, a hedge
    ("\\boxed{5} \\boxed{3}", ("5", "3")),
    ("\\boxed{5}, \\quad\\text{or}\\quad \\boxed{3}.", ("5", "3")),
    ("\\boxed{\\frac{1}{2}}", ("\\frac{1}{2}",)),                   # nested braces
    ("\\boxed{\\boxed{3}}", ("\\boxed{3}",)),                       # the outer box is the answer
    ("\\fbox{3}", ("3",)),
    ("\\boxed{3}}}", ("3",)),                                        # stray closing braces do not matter
    ("\\boxed{3", ()),                                               # a last box left open: no answer
    ("\\boxed{2} and then \\boxed{3", ()),
    ("no box here", None),
])
def test_final_box_group(text, expected):
    assert answers.final_box_group(text) == expected


def test_answer_region_reads_after_think_only():
    assert answers.answer_region("<think>\\boxed{5}</think> \\boxed{3}") == " \\boxed{3}"
    assert answers.answer_region("<think>still thinking \\boxed{3}") is None
    assert answers.answer_region("reasoning</think>\\boxed{3}") == "\\boxed{3}"   # the template opened the block
    assert len(answers.answer_region("x" * 50_000)) == answers.MAX_CHARS


@pytest.mark.parametrize("text, expected", [
    ("The final answer is $28 \\%$. I hope it is correct.", "$28 \\%$"),
    ("**Final Answer:** 7", "7"),
    ("The answer is 42 apples.\nThen more text.", "42 apples"),
    ("Answer: 3.5", "3.5"),
    ("The answer is\n\\[ 5 \\]", "\\[ 5 \\]"),
    ("answer is 1. Then the final answer is 2.", "2"),                   # the last anchor
    ("no anchor", None),
])
def test_anchored_answer(text, expected):
    assert answers.anchored_answer(text) == expected


@pytest.mark.parametrize("text, value", [
    ("42", 42), ("-17", -17), ("+3", 3), ("03", 3), ("3.0", 3), ("3.", 3), (".5", Fraction(1, 2)),
    ("1,000", 1000), ("1{,}000", 1000), ("1\\,000", 1000), ("1 000", 1000), ("12,\\!345", 12345),
    ("1e-7", Fraction(1, 10**7)), ("3/4", Fraction(3, 4)), ("\\frac{3}{4}", Fraction(3, 4)), ("\\dfrac34", Fraction(3, 4)),
    ("-\\frac{3}{4}", Fraction(-3, 4)), ("\\frac{-3}{4}", Fraction(-3, 4)), ("\\tfrac12", Fraction(1, 2)),
    ("(-17)", -17), ("$-17$", -17), ("\\boxed{3}", 3), ("\\text{3}", 3), ("{3}", 3), ("{{3}}", 3),
    ("\\left( 3 \\right)", 3), ("\\$18", 18), ("$18", 18), ("18 \\text{ dollars}", 18), ("18 apples", 18),
    ("30^\\circ", 30), ("15\\mbox{ cm}^2", 15),
    ("x = 3", 3), ("y=-2", -2), ("\\theta = 3", 3), ("25\\%", 25), ("25 percent", 25),
    ("\uff13", 3), ("\u0663", 3), ("1\u200b7", 17), ("\u22123", -3), ("\u2212 3", -3),
])
def test_literals(text, value):
    literal = answers.parse_literal(text)
    assert literal is not None and literal.value == value, text


@pytest.mark.parametrize("text", [
    "-9 - 8", "( -9 - 8 )", "2+3", "-(-3)", "--3", "+-3", "6/2", "\\frac{6}{2}", "4/1", "2^3", "3 \\times 10^{2}",
    "3, 5", "3 or 5", "3 \\text{ or } 5", "\\pm 3", "5 = 3", "x = 5 = 3", "\\pi = 3", "e = 3", "1,5", "1,00", "32, 349",
    "3x", "3 x", "3 or more", "minus 3", "\\sqrt{9}", "3!", "1\\frac{1}{2}", "", " ", "\\boxed{}", "abc", "3.5.1",
    "\u202e71", "9" * 300,
])
def test_not_literals(text):
    assert answers.parse_literal(text) is None, text


def test_words_mode_reads_one_number_in_a_sentence():
    assert answers.parse_literal("So she has 42 apples", words=True).value == 42
    assert answers.parse_literal("the total = 42", words=True).value == 42
    for text in ["In 2 hours she has 42", "not 5", "3 or 5", "minus 5", "5 - 3 = 2"]:
        assert answers.parse_literal(text, words=True) is None, text
    assert answers.parse_literal("So she has 42 apples") is None  # boxes are strict: no sentence around the number


def test_gold_fractions_may_be_unreduced():
    assert answers.parse_literal("2/4") is None
    assert answers.parse_literal("2/4", lowest_terms=False).value == Fraction(1, 2)


@pytest.mark.parametrize("pred, gold, equal", [
    ("3", "3.0", True), ("0.5", "\\frac{1}{2}", True), ("25\\%", "25", True), ("300\\%", "3", False),
    ("0.0000001", "0.0000002", False), ("0.1000004", "0.1", False), ("1e-7", "2e-7", False),
    ("\\frac{1}{3}", "0.333333", True), ("\\frac{1}{3}", "0.3333333333", True), ("\\frac{2}{3}", "0.666667", True),
    ("0.333333", "\\frac{1}{3}", True), ("0.666666", "\\frac{2}{3}", False), ("0.333", "0.33", False),
    ("\\frac{1}{3}", "0.33", False), ("0.33", "\\frac{1}{3}", False), ("2/7", "0.3", False), ("1/8", "0.125", True),
    ("1/8", "0.13", False),
])
def test_literal_equal(pred, gold, equal):
    assert answers.literal_equal(answers.parse_literal(pred), answers.parse_literal(gold, lowest_terms=False)) is equal


def test_single_answer():
    assert answers.single_answer(("3", "3.0", " 3 ")) == " 3 "
    assert answers.single_answer(("3", "\uff13")) == "\uff13"
    assert answers.single_answer(("3", "5")) is None
    assert answers.single_answer(()) is None
