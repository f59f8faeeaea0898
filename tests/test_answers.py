"""grpo_recipes/rewards/answers.py: where the final answer is, and what a number literal is (shared by the answer rewards)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from grpo_recipes.rewards import answers


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


# ---- issue 34: what a person would not read as the answer

@pytest.mark.parametrize("text, expected", [
    ("\\boxed{3} or \\boxed 5", ("3", "\\boxed 5")),                 # LaTeX boxes one token without braces
    ("\\boxed{3} or \\framebox{5}", ("3", "\\framebox{5}")),
    ("\\boxed{3} or 5.", ("3", "5")),
    ("$\\boxed{3}$ and $5$", ("3", "5")),
    ("\\boxed{3}, 5", ("3", "5")),                                  # a list
    ("\\boxed{3} \\text{ or maybe } -5", ("3", "-5")),
    ("\\boxed{3}. Check: 3 + 4 = 7.", ("3",)),                       # other words: not a second answer
    ("\\boxed{3}\n\n2. Next question", ("3",)),
    ("$\\boxed{3} + 1$", ("3",)),                                    # math around the box, no connector
    ("\\boxed{3}. Hope this helps!", ("3",)),
])
def test_a_value_joined_after_the_final_box_joins_its_group(text, expected):
    assert answers.final_box_group(text) == expected


@pytest.mark.parametrize("text", [
    "The final answer is $3$ or $5$.", "The final answer is \\(3\\) or \\(5\\).", "The final answer is $3$, $5$.",
    "The answer is 3. Or 5.", "The answer is $3$ or maybe \\frac{1}{2}",
])
def test_an_anchored_hedge_is_no_answer(text):
    assert answers.anchored_answer(text) is None


def test_anchored_answers_with_words_after_them_are_kept():
    assert answers.anchored_answer("The answer is $3$ apples.") == "$3$"
    assert answers.anchored_answer("The answer is $3$, which is odd.") == "$3$"


@pytest.mark.parametrize("text", ["never 7", "no 7", "not 7", "7 \\text{ is wrong}", "7 \\text{ is incorrect}",
                                  "7 is false", "7 \\text{ isn't it}"])
def test_a_negated_number_is_no_answer(text):
    assert answers.parse_literal(text, words=True) is None, text


def test_negated_finds_negation_words_outside_latex_commands():
    assert answers.negated("7 \\text{ is wrong}") and answers.negated("not 7")
    assert not answers.negated("x \\neq 7") and not answers.negated("7 \\text{ apples}")


@pytest.mark.parametrize("text, normal", [("1³", "1^{3}"), ("2²³", "2^{23}"), ("x₁", "x_{1}"), ("１³", "1^{3}"),
                                          ("\uff13", "3")])
def test_superscripts_and_subscripts_are_exponents_and_indices(text, normal):
    assert answers.normalize_text(text) == normal
    assert answers.parse_literal("1³") is None and answers.parse_literal("1₃") is None


@pytest.mark.parametrize("content, blank", [
    ("", True), (" ", True), ("{}", True), ("{ {} }", True), ("\\text{}", True), ("\\text{ }", True), ("\u200b", True),
    ("\\phantom{0}", True), ("\\phantom{\\frac{1}{2}}", True), ("\\quad", True), ("$ $", True), ("\\hspace{1cm}", True),
    ("\u2800", True), ("B", False), ("7", False), ("\\phantom{0}7", False), ("\\frac{1}{2}", False),
    ("\\text{apples}", False), ("x", False),
])
def test_is_blank(content, blank):
    assert answers.is_blank(content) is blank


@pytest.mark.parametrize("text, false", [
    ("7 + 1 = 7. \\boxed{7}", True),
    ("7 + 1 = 7. So 7 = 7. \\boxed{7}", True),                       # an earlier clause counts too
    ("So 3 + 4 = 8, no: 3 + 4 = 7. \\boxed{7}", True),                # so does a corrected one
    ("7 + 1 = \\boxed{7}", True),                                    # a box as the last side
    ("\\[ 7 + 1 = 9 \\]", True), ("7 + 1 = 7ne", True), ("3 × 4 = 13", True),
    ("-7 + 4 = -3. \\boxed{-3}", False), ("-(5 + 2) = -(7) = -7. \\boxed{-7}", False),
    ("1 + 1 = 2. \\boxed{7}", False),                                # true: check_working's case, not this one
    ("10 / 3 = 3.33", False), ("1.5 + 2.5 = 4.0", False), ("2/4 = 1/2", False), ("1,000 = 999 + 1", False),
    ("$7 + 1 = 8$", False), ("-4 + -3 = -seven", False), ("90 + 15 = one hundred and five", False),
    ("x = 7", False), ("0.5 = 50%", False), ("9^9^9^9 = 5", False),   # not judged
    ("2 times 3 = 7", True), ("1 minus 4 equals 5", True),           # operators and relations in words
    ("<think>7 + 1 = 7</think> \\boxed{7}", True),                   # the reasoning inside <think> counts too
])
def test_false_equation(text, false):
    assert answers.false_equation(text) is false, text


# ---- issue 34, item 6: the work per completion is bounded, counted rather than timed

PADDED_BOXES = " ".join(f"\\boxed{{{i}{' ' * 790}x}}" for i in range(24))   # ~2 s over two rewards before
PADDED_SIGN = "\\boxed{-" + " " * 790 + "7x}"                               # 13 s in one number pattern before


class _Recorder:
    """A compiled pattern that records the text it is run on: (start, end, the text from start)."""

    def __init__(self, pattern, seen: list):
        self.pattern, self.seen = pattern, seen

    def search(self, text, pos=0, *rest):
        self.seen.append(text[pos:])
        return self.pattern.search(text, pos, *rest)

    def fullmatch(self, text, *rest):
        self.seen.append(text)
        return self.pattern.fullmatch(text, *rest)


@pytest.mark.parametrize("text", [PADDED_BOXES, PADDED_SIGN], ids=["24 padded boxes", "padded sign"])
def test_number_patterns_see_no_run_of_spaces_and_only_a_short_tail(monkeypatch, text):
    from grpo_recipes.rewards.registry import available

    seen = {name: [] for name in ("_NUMBER", "_UNIT", "_PERCENT")}
    for name, log in seen.items():
        monkeypatch.setattr(answers, name, _Recorder(getattr(answers, name), log))
    parses = []
    parse = answers.parse_literal
    monkeypatch.setattr(answers, "parse_literal", lambda *a, **k: parses.append(a[0]) or parse(*a, **k))
    rewards = available()
    assert rewards["math_correctness"].func([text], ["7"], lambda *a: None, check_working=True,
                                            check_equations=True) == [0.0]
    assert rewards["boxed_format"].func([text], numeric=True) == [0.0]
    # Before: every box parsed, each pattern run over ~800 characters with a run of 790 spaces in them.
    assert len(parses) <= 6, len(parses)
    assert all(len(t) <= answers._TAIL for t in seen["_UNIT"] + seen["_PERCENT"])
    assert seen["_NUMBER"] and not any("  " in t for t in seen["_NUMBER"])


def test_the_recorder_sees_what_a_long_text_would_cost(monkeypatch):
    """The test above can fail: an unbounded search is recorded at its full length."""
    seen = []
    monkeypatch.setattr(answers, "_UNIT", _Recorder(answers._UNIT, seen))
    answers._UNIT.search(PADDED_SIGN)
    assert len(seen[0]) > answers._TAIL


def test_the_same_value_twice_is_one_answer():
    assert answers.single_answer(answers.final_box_group("$\\boxed{3}$ and $3$")) == "3"
    assert answers.single_answer(answers.final_box_group("\\boxed{3} or \\(3.0\\)")) == "3.0"


# ---- issue 46: what the reading policy read past, and fair answers it refused


@pytest.mark.parametrize("text, expected", [
    # Item 14: the text around the final box takes it back.
    ("\\boxed{3} no wait, 5", ()), ("\\boxed{3}. Actually, the answer is 5.", ()), ("It is not \\boxed{3}.", ()),
    ("\\boxed{3} is wrong.", ()), ("\\boxed{3}. That is not correct.", ()), ("\\boxed{3} is wrong, it's 5", ()),
    ("\\boxed{3}. The answer is 5.", ()), ("\\boxed{3}. Just kidding.", ()), ("isn't $\\boxed{3}$", ()),
    ("\\boxed{3} \u274c", ()), ("\\boxed{3} (not really)", ()),
    # ...what a reader does not see is not read: the visible box is the answer.
    ("\\boxed{5}\n<!-- final: \\boxed{3} -->", ("5",)), ("\\boxed{5}\n% final: \\boxed{3}", ("5",)),
    ("\\boxed{5}. Final: ~~\\boxed{3}~~", ("5",)), ("\\boxed{5}. Final: \\phantom{\\boxed{3}}", ("5",)),
    ("\\boxed{5}. Final: \\cancel{\\boxed{3}}", ("5",)), ("\\boxed{5}. Final: <del>\\boxed{3}</del>", ("5",)),
    # ...boxes joined by spacing however long, or by a few words offering an alternative, are one hedge.
    ("\\boxed{5}" + " " * 250 + "\\boxed{3}", ("5", "3")), ("\\boxed{5} or else \\boxed{3}", ("5", "3")),
    ("\\boxed{5}, or it could be \\boxed{3}", ("5", "3")), ("\\boxed{3}" + " " * 250 + "or 5", ("3", "5")),
    # What a person accepts stays one answer.
    ("\\boxed{3}, not 5.", ("3",)), ("\\boxed{3}. I hope it is correct.", ("3",)), ("\\boxed{3}, no doubt.", ("3",)),
    ("\\boxed{3}\n\nDon't hesitate to ask if anything is unclear!", ("3",)), ("\\boxed{3}. 5 is wrong.", ("3",)),
    ("\\boxed{5}. Wait, that is wrong. \\boxed{3}", ("3",)), ("\\boxed{5}. Wait, no: \\boxed{3}", ("3",)),
    ("\\boxed{3}. Wait, let me verify: 1 + 2 = 3.", ("3",)), ("<s> \\boxed{3}</s>", ("3",)), ("\\boxed{25%}", ("25%",)),
])
def test_issue46_text_around_the_final_box(text, expected):
    assert answers.final_box_group(answers.answer_region(text)) == expected


def test_issue46_a_think_opened_again_after_the_answer_is_no_answer_yet():
    assert answers.answer_region("<think>ok</think>\\boxed{5}\n<think>hmm, actually \\boxed{3}") is None
    assert answers.answer_region("<think>a</think>\\boxed{5}<think>b</think> \\boxed{3}") == " \\boxed{3}"


def test_issue46_an_anchored_answer_taken_back_is_none():
    assert answers.anchored_answer("The answer is 3. Wait, 5.") is None
    assert answers.anchored_answer("The answer is 3. I hope it is correct.") == "3"


@pytest.mark.parametrize("text, value", [
    ("\\boldsymbol{3}", 3), ("\\bm{3}", 3), ("\\mathbf{3}", 3), ("\\textit{3}", 3), ("\u200e3", 3), ("\u200f-3", -3),
])
def test_issue46_fair_literals(text, value):
    literal = answers.parse_literal(text)
    assert literal is not None and literal.value == value, text


@pytest.mark.parametrize("text", ["3 \\text{ eight}", "3 \\text{ is ruled out}", "3 \\text{ nope}", "3 maybe",
                                  "3 \\text{ excluded}"])
def test_issue46_a_unit_is_no_number_word_nor_clause(text):
    assert answers.parse_literal(text) is None, text
    assert answers.parse_literal("3 \\text{ apples}").value == 3


@pytest.mark.parametrize("text, read", [
    ("7 + 1 equals 9", "7 + 1 = 9"), ("7 + 1 \uff1d 9", "7 + 1 = 9"), ("7 + 1 \u2192 9", "7 + 1 = 9"),
    ("7 + 1 -> 9", "7 + 1 = 9"), ("7 + 1 => 9", "7 + 1 = 9"), ("7 + 1 \\Rightarrow 9", "7 + 1 = 9"),
    ("7 + 1 \\approx 9", "7 + 1 = 9"), ("7 + 1 == 9", "7 + 1 = 9"), ("7 + 1 is equal to 9", "7 + 1 = 9"),
    ("\\begin{aligned} 7 + 1 &= 9 \\\\ &= 8 \\end{aligned}", "7 + 1 = 9 = 8"), ("7 + 1\n= 9", "7 + 1 = 9"),
    ("7 +" + " " * 300 + "1 = 9", "7 + 1 = 9"), ("x + 3 = 5 \u21d2 x = 2", "x + 3 = 5 ; x = 2"),
    ("So 7 + 1 is 9", "So 7 + 1 = 9"), ("The sum is 9", "= 9"), ("It is 3 more than 5", "It is 3 more than 5"),
    ("The second is 4", "The second is 4"),
    ("3 + 4 \\neq 8 = 7", "3 + 4 ; 8 = 7"),
])
def test_issue46_relations_are_read_as_equals(text, read):
    assert " ".join(answers.read_relations(text).split()) == read


@pytest.mark.parametrize("text, unrelated", [
    ("0 + 7 = 7. \\boxed{7}", True), ("2 + 5 = 7. \\boxed{7}", True), ("7 * 1 = 7. \\boxed{7}", True),
    ("3 + 4 = 7. 7 + 0 = 7. \\boxed{7}", True),
    ("3 + 4 = 7. \\boxed{7}", False), ("4 + 3 = 7. \\boxed{7}", False), ("3 plus 4 equals 7. \\boxed{7}", False),
    ("Step 1: 3 + 4 = 7. \\boxed{7}", False), ("\\boxed{7}", False), ("So 7 = 7. \\boxed{7}", False),
])
def test_issue46_working_about_other_numbers(text, unrelated):
    assert answers.working_unrelated(text, "3 + 4") is unrelated, text


def test_issue46_working_may_use_the_question_parts_and_earlier_results():
    for text in ["7 * 2 = 14. \\boxed{14}", "3 + 4 = 7, 7 * 2 = 14. \\boxed{14}",
                 "(3 + 4) * 2 = 7 * 2 = 14. \\boxed{14}"]:
        assert not answers.working_unrelated(text, "(3 + 4) * 2"), text
    assert answers.working_unrelated("14 * 2 / 2 = 14. \\boxed{14}", "(3 + 4) * 2")  # the answer is no part


def test_issue46_the_asked_expression_is_the_last_user_turn_worth_the_gold():
    chat = [{"role": "user", "content": "Calculate 2 + 5."}, {"role": "assistant", "content": "2 + 5 = 7. \\boxed{7}"},
            {"role": "user", "content": "Calculate 3 + 4."}]
    assert answers.asked_expression(chat, "7") == "3 + 4"
    assert answers.asked_expression(chat, "8") is None  # not worth the gold: the question is not known
    assert answers.asked_expression("Natalia sold 48 clips.", "72") is None
    assert answers.asked_expression([{"role": "user", "content": [{"type": "text", "text": "Calculate 1 - 4."}]}],
                                    "-3") == "1 - 4"
