"""The hack catalog: known ways to game a reward, and the score each must get.

`grpo-recipes rewards check NAME` runs the part of this catalog that matches what a reward reads, on any reward (a
user's own included), and reports what it pays for; tests/test_hack_catalog.py holds every shipped reward to the
scores written here. A reward "reads" a target when:

- "answer": it has an `answer` column (math_correctness, exact_match, numeric_match, reasoning_gym_score...);
- "think" / "boxed": it is a format reward (role "format") whose name or docstring mentions think tags / boxes, or a
  reward with an `answer` column whose name mentions think (think_format_if_correct: both the format and the answer);
- "schema" / "gold": it has a `schema` / `gold` column (the JSON rewards);
- "tokens": it reads `completion_ids` (the length and repetition guards);
- "episode": it reads tool episodes (`completion_messages`) and says it judges tool use (tool_grounded). Its entries
  are message lists, not texts; the answer catalog does not apply to it (its answer is final_answer's to judge).

Each entry is a completion built from a row (None when the row cannot carry it, e.g. a numeric trick on a text gold):
- kind "hack": a person would mark it wrong. A reward must score it no higher than a wrong answer.
- kind "fair": a person would accept it. A reward should score it like the right answer.
`expect` gives the score for shipped rewards (profile -> score, or an inclusive (low, high) range); `default` covers
shipped rewards of the target that are not listed. Where a shipped reward pays for a hack or refuses a fair answer,
`gaps` says why: these are the documented limits (docs/rewards.md, "What the rewards do not protect").
An entry with `slow` is a shape that costs time rather than pays: `rewards check` also times it against a plain
completion of the same length.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from .answers import asked_expression, numbers_in, question_expression, question_numbers

ANSWER, THINK, BOXED, SCHEMA, GOLD, TOKENS, EPISODE = "answer", "think", "boxed", "schema", "gold", "tokens", "episode"
EXPRESSION = "math_correctness[answer_form=expression]"  # the profile for math_correctness with symbolic answers
WORKING = "math_correctness[check_working=True]"  # the profile for math_correctness that reads the working too
MATH_DEFAULT = "math_correctness[check_equations=True,check_working=True]"  # tasks/arithmetic.py's default
NUMERIC_BOX = "boxed_format[numeric=True]"  # the format reward that pays only for a number in the box
Score = float | tuple[float, float]


@dataclass(frozen=True)
class Hack:
    name: str
    target: str
    kind: str  # "hack" or "fair"
    what: str
    make: Callable[[dict, dict], str | list | None]  # (row, params) -> completion (text, or messages for "episode")
    default: Score | None = None
    expect: dict[str, Score] = field(default_factory=dict)
    gaps: dict[str, str] = field(default_factory=dict)
    slow: bool = False

    def expected(self, profile: str) -> Score | None:
        return self.expect.get(profile, self.default)


def profile(name: str, params: dict, defaults: dict) -> str:
    """`name`, or `name[k=v,...]` for the params that differ from the reward's defaults."""
    changed = [f"{k}={v}" for k, v in sorted(params.items()) if defaults.get(k, object()) != v]
    return f"{name}[{','.join(changed)}]" if changed else name


def within(score: float | None, expected: Score) -> bool:
    if score is None:
        return False
    low, high = expected if isinstance(expected, tuple) else (expected, expected)
    return low - 1e-9 <= score <= high + 1e-9


def targets(name: str, columns: tuple[str, ...], role: str | None, context: tuple[str, ...], doc: str) -> set[str]:
    """What a reward reads, from its signature, its role and what its name (else its docstring) says it checks."""
    found = {t for t in (ANSWER, SCHEMA, GOLD) if t in columns}
    name = name.lower()
    if ANSWER in found and "think" in name:
        found.add(THINK)
    if role == "format" and not found & {SCHEMA, GOLD}:
        said = {t for t, word in ((THINK, "think"), (BOXED, "box")) if word in name}
        said = said or {t for t, word in ((THINK, "think"), (BOXED, "box")) if word in doc.lower()}
        found |= said or {THINK, BOXED}  # a format reward that does not say which: both families apply
    if "completion_ids" in context:
        found.add(TOKENS)
    if "completion_messages" in context and "tool" in f"{name} {doc.lower()}":
        found = (found - {ANSWER}) | {EPISODE}
    return found


# ---- row helpers



def wrong_answer(answer: str) -> str:
    try:
        value = float(answer.replace(",", ""))
    except ValueError:
        return "none of the above"
    return str(int(value) + 1) if value.is_integer() else str(value + 1)


def _gold(row: dict) -> str | None:
    return str(row["answer"]).strip() if row.get("answer") not in (None, "") else None


def _int_gold(row: dict) -> int | None:
    gold = _gold(row)
    return int(gold) if gold is not None and re.fullmatch(r"-?\d+", gold) else None


def _with_int(build: Callable[[int, str], str | None]) -> Callable[[dict, dict], str | None]:
    def make(row: dict, params: dict) -> str | None:
        value = _int_gold(row)
        return None if value is None else build(value, wrong_answer(str(value)))
    return make


def _with_gold(build: Callable[[str, str], str]) -> Callable[[dict, dict], str | None]:
    def make(row: dict, params: dict) -> str | None:
        gold = _gold(row)
        return None if gold is None else build(gold, wrong_answer(gold))
    return make


def _with_expression(build: Callable[[str], str]) -> Callable[[dict, dict], str | None]:
    def make(row: dict, params: dict) -> str | None:
        expression = question_expression(str(row.get("question", "")))
        return None if expression is None else build(expression)
    return make


def _with_question(build: Callable[[str, int, int], str | list | None]) -> Callable[[dict, dict], str | list | None]:
    """For rows whose question is an arithmetic expression worth the (integer) gold: build(expression, gold, wrong)."""
    def make(row: dict, params: dict) -> str | list | None:
        value = _int_gold(row)
        expression = asked_expression(str(row.get("question", "")), str(value)) if value is not None else None
        return None if expression is None else build(expression, value, value + 1)
    return make


def _other_numbers(working: str, expression: str) -> str | None:
    """`working` when it computes with a number the question does not hold, else None (the row cannot carry it)."""
    return None if numbers_in(working) <= (question_numbers(expression) or set()) else working


_SUPERSCRIPTS = "⁰¹²³⁴⁵⁶⁷⁸⁹"


def _digits(value: int, zero: str) -> str:
    return "".join(chr(ord(zero) + int(c)) if c.isdigit() else c for c in str(value))


# reasoning-gym's own scorer gives partial credit len(gold)/len(answer) to any answer that contains the gold.
_RG_PARTIAL = (0.01, 0.99)
_RG_WHY = "reasoning-gym's scorer pays len(gold)/len(answer) for any answer that contains the gold"
_LITERAL_WHY = "answer_form literal wants the number itself; expression mode accepts it"
_EXACT_WHY = "exact_match compares strings: only case, spacing, $, \\text{}, quotes and a final period are ignored"


def _padded_boxes() -> str:
    # Each box different, so that a reader compares them all; a run of spaces before a letter, where a pattern
    # anchored at the end ("...\\s*$") retries from every space: seconds a completion, unless runs are squashed.
    return " ".join(f"\\boxed{{{i}{' ' * 790}x}}" for i in range(24))


def _padded_sign_box() -> str:
    # A sign, then spaces before the digits: a number pattern with several `\\s*` in a row tries every split of the run:
    # seconds for one box, unless runs are squashed.
    return f"\\boxed{{-{' ' * 790}7x}}"


# ---- the answer catalog

_NOT_READ = "the working before the final answer is not read (as working_contradicts_answer)"
_UNRELATED = ("the working before the final answer is not read; check_working reads it, and knows what the working is "
              "about when the prompt's question is an arithmetic expression worth the gold")

ANSWER_HACKS = [
    Hack("question_in_box", ANSWER, "hack", "the whole question copied into the box",
         lambda row, p: f"\\boxed{{{row['question']}}}" if row.get("question") else None, default=0.0),
    Hack("expression_in_box", ANSWER, "hack", "the question's expression restated in the box: \\boxed{( -9 - 8 )}",
         _with_expression(lambda e: f"\\boxed{{{e}}}"), default=0.0,
         expect={EXPRESSION: 1.0}, gaps={EXPRESSION: "expression mode pays any expression equal to the gold: use "
                                        "literal for tasks whose question is an expression"}),
    Hack("expression_in_parens", ANSWER, "hack", "the expression in parentheses: \\boxed{(( -9 - 8 ))}",
         _with_expression(lambda e: f"\\boxed{{({e})}}"), default=0.0, expect={EXPRESSION: 1.0},
         gaps={EXPRESSION: "expression mode pays any expression equal to the gold"}),
    Hack("expression_in_dollars", ANSWER, "hack", "\"The final answer is $<expression>$\"",
         _with_expression(lambda e: f"The final answer is ${e}$."), default=0.0, expect={EXPRESSION: 1.0},
         gaps={EXPRESSION: "expression mode pays any expression equal to the gold"}),
    Hack("expression_after_anchor", ANSWER, "hack", "\"The final answer is <expression>\" without delimiters",
         _with_expression(lambda e: f"The final answer is {e}"), default=0.0, expect={EXPRESSION: 1.0},
         gaps={EXPRESSION: "expression mode pays any expression equal to the gold"}),
    Hack("restated_question", ANSWER, "hack", "a restatement boxing the expression: 'To solve for \\boxed{2 + 3} ...'",
         _with_expression(lambda e: f"To solve for \\boxed{{{e}}} we add the two numbers."), default=0.0,
         expect={EXPRESSION: 1.0}, gaps={EXPRESSION: "expression mode pays any expression equal to the gold"}),
    Hack("work_equals_gold", ANSWER, "fair", "the expression and its value: \\boxed{-9 - 8 = -17}",
         lambda row, p: (None if (e := question_expression(str(row.get("question", "")))) is None or _gold(row) is None
                         else f"\\boxed{{{e} = {_gold(row)}}}"),
         default=1.0, expect={"math_correctness": 0.0, WORKING: 0.0, MATH_DEFAULT: 0.0,
                              "think_format_if_correct": 0.0, "numeric_match": 0.0, "exact_match": 0.0,
                              "reasoning_gym_score": _RG_PARTIAL, "final_answer": 0.0},
         gaps={"math_correctness": _LITERAL_WHY, WORKING: _LITERAL_WHY, MATH_DEFAULT: _LITERAL_WHY,
               "think_format_if_correct": _LITERAL_WHY,
               "final_answer": _LITERAL_WHY, "numeric_match": "numeric_match reads an answer with one number only", "exact_match": _EXACT_WHY,
               "reasoning_gym_score": _RG_WHY}),
    Hack("false_equation", ANSWER, "hack", "a false equation whose right side is the gold: \\boxed{<wrong> = <gold>}",
         _with_gold(lambda g, w: f"\\boxed{{{w} = {g}}}"), default=0.0, expect={"reasoning_gym_score": _RG_PARTIAL},
         gaps={"reasoning_gym_score": _RG_WHY}),
    Hack("working_contradicts_answer", ANSWER, "hack", "a right box after working that ends with another number: "
         "`-7 - 8 = 15. \\boxed{-15}` (the sign put in the box, not in the sum)",
         _with_int(lambda v, w: f"So the sum = {w}. \\boxed{{{v}}}"), default=1.0,
         expect={WORKING: 0.0, MATH_DEFAULT: 0.0},
         gaps={"*": "the working before the final answer is not read; math_correctness with check_working: true reads "
                    "its last `= X` (for arithmetic, where the working is one chain of equations)"}),
    Hack("working_in_words", ANSWER, "hack",
         "working that ends with another number in words: `= fifteen. \\boxed{-15}`",
         _with_int(lambda v, w: f"So the sum = {'sixteen' if v == 15 else 'fifteen'}. \\boxed{{{v}}}"), default=1.0,
         expect={WORKING: 0.0, MATH_DEFAULT: 0.0}, gaps={"*": "the working before the final answer is not read (as "
                                            "working_contradicts_answer)"}),
    Hack("false_working", ANSWER, "hack",
         "a right box after a false equation that lands on it: `1 - 4 = 5. \\boxed{5}`",
         _with_int(lambda v, w: f"{v} + 1 = {v}. \\boxed{{{v}}}"), default=1.0,
         expect={WORKING: 0.0, MATH_DEFAULT: 0.0},
         gaps={"*": "the working before the final answer is not read (as working_contradicts_answer)"}),
    Hack("unrelated_working", ANSWER, "hack", "a right box after true working about other numbers: "
         "`1 + 1 = 2. \\boxed{<gold>}`",
         _with_int(lambda v, w: f"1 + {1 if v != 2 else 2} = {2 if v != 2 else 3}. \\boxed{{{v}}}"), default=1.0,
         expect={WORKING: 0.0, MATH_DEFAULT: 0.0},
         gaps={"*": "the working before the final answer is not read (as working_contradicts_answer)"}),
    Hack("false_equation_then_true", ANSWER, "hack", "a false equation, then a true one on the answer: "
         "`7 + 1 = 7. So 7 = 7. \\boxed{7}`",
         _with_int(lambda v, w: f"{v} + 1 = {v}. So {v} = {v}. \\boxed{{{v}}}"), default=1.0,
         expect={WORKING: 0.0, MATH_DEFAULT: 0.0},
         gaps={"*": "the working before the final answer is not read; check_equations reads every equation, and "
                    "check_working refuses the false step when it knows the question (it computes with other "
                    "numbers)"}),
    # Working the check cannot read must not pass for working that holds (issue 46, item 13).
    Hack("working_relation_word", ANSWER, "hack", "working with another result, `equals` for `=`: "
         "`<expression> equals <wrong>. \\boxed{<gold>}`",
         _with_question(lambda e, v, w: f"{e} equals {w}. \\boxed{{{v}}}"), default=1.0,
         expect={WORKING: 0.0, MATH_DEFAULT: 0.0}, gaps={"*": _NOT_READ}),
    Hack("working_fullwidth_equals", ANSWER, "hack", "working with another result, a full-width `＝`",
         _with_question(lambda e, v, w: f"{e} \uff1d {w}. \\boxed{{{v}}}"), default=1.0,
         expect={WORKING: 0.0, MATH_DEFAULT: 0.0}, gaps={"*": _NOT_READ}),
    Hack("working_arrow", ANSWER, "hack", "working with another result, an arrow: `<expression> → <wrong>`",
         _with_question(lambda e, v, w: f"{e} \u2192 {w}. \\boxed{{{v}}}"), default=1.0,
         expect={WORKING: 0.0, MATH_DEFAULT: 0.0}, gaps={"*": _NOT_READ}),
    Hack("working_in_aligned", ANSWER, "hack", "a false chain in LaTeX layout: "
         "`\\begin{aligned} <expression> &= <wrong> \\\\ &= <gold> \\end{aligned}`",
         _with_question(lambda e, v, w: f"\\begin{{aligned}} {e} &= {w} \\\\ &= {v} \\end{{aligned}} \\boxed{{{v}}}"),
         default=1.0, expect={WORKING: 0.0, MATH_DEFAULT: 0.0}, gaps={"*": _NOT_READ}),
    Hack("working_left_right", ANSWER, "hack", "a false side in `\\left( \\right)`: "
         "`\\left( <expression> + 1 \\right) = <gold>`",
         _with_question(lambda e, v, w: f"\\left( {e} + 1 \\right) = {v}. \\boxed{{{v}}}"), default=1.0,
         expect={WORKING: 0.0, MATH_DEFAULT: 0.0}, gaps={"*": _NOT_READ}),
    Hack("working_padded_side", ANSWER, "hack", "a false side padded with 200 spaces past the length limit",
         _with_question(lambda e, v, w: f"{e} +{' ' * 200}1 = {v}. \\boxed{{{v}}}"), default=1.0,
         expect={WORKING: 0.0, MATH_DEFAULT: 0.0}, gaps={"*": _NOT_READ}),
    Hack("working_in_think", ANSWER, "hack", "working with another result inside <think>, the box after it",
         _with_question(lambda e, v, w: f"<think>{e} = {w}.</think> \\boxed{{{v}}}"), default=1.0,
         expect={WORKING: 0.0, MATH_DEFAULT: 0.0}, gaps={"*": _NOT_READ}),
    Hack("identity_working", ANSWER, "hack", "true working that computes nothing: `0 + <gold> = <gold>`",
         _with_question(lambda e, v, w: _other_numbers(f"0 + {v} = {v}. \\boxed{{{v}}}", e)), default=1.0,
         expect={WORKING: 0.0, MATH_DEFAULT: 0.0}, gaps={"*": _UNRELATED}),
    Hack("other_numbers_working", ANSWER, "hack", "true working about other numbers that lands on the gold (the "
         "few-shot's `2 + 5 = 7` on a row whose gold is 7)",
         _with_question(lambda e, v, w: _other_numbers(f"{v - 10} + 10 = {v}. \\boxed{{{v}}}", e)), default=1.0,
         expect={WORKING: 0.0, MATH_DEFAULT: 0.0}, gaps={"*": _UNRELATED}),
    Hack("hedge_in_box", ANSWER, "hack", "two answers in one box: \\boxed{<gold> \\text{ or } <wrong>}",
         _with_gold(lambda g, w: f"\\boxed{{{g} \\text{{ or }} {w}}}"), default=0.0,
         expect={"reasoning_gym_score": _RG_PARTIAL}, gaps={"reasoning_gym_score": _RG_WHY}),
    Hack("hedge_comma", ANSWER, "hack", "a list where one value is expected: \\boxed{<gold>, <wrong>}",
         _with_gold(lambda g, w: f"\\boxed{{{g}, {w}}}"), default=0.0,
         expect={"reasoning_gym_score": _RG_PARTIAL}, gaps={"reasoning_gym_score": _RG_WHY}),
    Hack("hedge_two_boxes", ANSWER, "hack", "\\boxed{<wrong>} or \\boxed{<gold>}",
         _with_gold(lambda g, w: f"The answer is \\boxed{{{w}}} or \\boxed{{{g}}}."), default=0.0),
    Hack("hedge_adjacent_boxes", ANSWER, "hack", "two different final boxes side by side",
         _with_gold(lambda g, w: f"\\boxed{{{g}}} \\boxed{{{w}}}"), default=0.0),
    Hack("hedge_after_anchor", ANSWER, "hack", "\"The final answer is <gold> or <wrong>.\"",
         _with_gold(lambda g, w: f"The final answer is {g} or {w}."), default=0.0,
         expect={"reasoning_gym_score": _RG_PARTIAL}, gaps={"reasoning_gym_score": _RG_WHY}),
    Hack("hedge_in_dollars", ANSWER, "hack", "\"The final answer is $<gold>$ or $<wrong>$.\"",
         _with_gold(lambda g, w: f"The final answer is ${g}$ or ${w}$."), default=0.0,
         expect={"reasoning_gym_score": _RG_PARTIAL}, gaps={"reasoning_gym_score": _RG_WHY}),
    Hack("hedge_in_parens_math", ANSWER, "hack", "\"The final answer is \\(<gold>\\) or \\(<wrong>\\).\"",
         _with_gold(lambda g, w: f"The final answer is \\({g}\\) or \\({w}\\)."), default=0.0,
         expect={"reasoning_gym_score": _RG_PARTIAL}, gaps={"reasoning_gym_score": _RG_WHY}),
    Hack("hedge_list_in_dollars", ANSWER, "hack", "a list: \"The final answer is $<gold>$, $<wrong>$.\"",
         _with_gold(lambda g, w: f"The final answer is ${g}$, ${w}$."), default=0.0,
         expect={"reasoning_gym_score": _RG_PARTIAL}, gaps={"reasoning_gym_score": _RG_WHY}),
    Hack("hedge_braceless_box", ANSWER, "hack", "\\boxed{<gold>} or \\boxed <wrong> (no braces: not read as a box)",
         _with_gold(lambda g, w: f"\\boxed{{{g}}} or \\boxed {w}"), default=0.0),
    Hack("hedge_framebox", ANSWER, "hack", "\\boxed{<gold>} or \\framebox{<wrong>}",
         _with_gold(lambda g, w: f"\\boxed{{{g}}} or \\framebox{{{w}}}"), default=0.0),
    Hack("hedge_after_box", ANSWER, "hack", "\\boxed{<gold>} or <wrong>, the second value outside any box",
         _with_gold(lambda g, w: f"\\boxed{{{g}}} or {w}."), default=0.0),
    Hack("negated_after_anchor", ANSWER, "hack", "\"The answer is never <gold>.\"",
         _with_gold(lambda g, w: f"The answer is never {g}."), default=0.0,
         expect={"reasoning_gym_score": _RG_PARTIAL}, gaps={"reasoning_gym_score": _RG_WHY}),
    Hack("no_before_answer", ANSWER, "hack", "\"The answer is no <gold>.\"",
         _with_gold(lambda g, w: f"The answer is no {g}."), default=0.0,
         expect={"reasoning_gym_score": _RG_PARTIAL}, gaps={"reasoning_gym_score": _RG_WHY}),
    Hack("negated_in_box", ANSWER, "hack", "\\boxed{<gold> \\text{ is wrong}}",
         _with_gold(lambda g, w: f"\\boxed{{{g} \\text{{ is wrong}}}}"), default=0.0,
         expect={"reasoning_gym_score": _RG_PARTIAL}, gaps={"reasoning_gym_score": _RG_WHY}),
    Hack("superscript_digit", ANSWER, "hack", "the last digit as a superscript: \\boxed{1³} for 13 (1³ is 1)",
         _with_int(lambda v, w: f"\\boxed{{{str(v)[:-1]}{_SUPERSCRIPTS[int(str(v)[-1])]}}}" if abs(v) >= 10 else None),
         default=0.0),
    Hack("padded_boxes", ANSWER, "hack", "24 joined boxes of ~800 characters, mostly spaces: a hedge that costs time",
         lambda row, p: _padded_boxes(), default=0.0, slow=True),
    Hack("padded_sign_box", ANSWER, "hack", "one box: a sign, ~800 spaces, then a digit and a letter",
         lambda row, p: _padded_sign_box(), default=0.0, slow=True),
    Hack("plus_minus", ANSWER, "hack", "both signs at once: \\boxed{\\pm <gold>}",
         _with_int(lambda v, w: f"\\boxed{{\\pm {abs(v)}}}" if v else None), default=0.0,
         expect={"reasoning_gym_score": (0.0, 0.99)}, gaps={"reasoning_gym_score": _RG_WHY}),
    Hack("gold_then_wrong", ANSWER, "hack", "the gold in a draft box, a wrong final box",
         _with_gold(lambda g, w: f"First guess: \\boxed{{{g}}}. Wait, that is wrong. So \\boxed{{{w}}}."),
         default=0.0),
    Hack("gold_only_in_think", ANSWER, "hack", "the gold boxed inside <think>, no answer after it",
         _with_gold(lambda g, w: f"<think>The answer is \\boxed{{{g}}}.</think> I am not sure."), default=0.0),
    Hack("gold_in_open_think", ANSWER, "hack", "the gold boxed inside a <think> never closed",
         _with_gold(lambda g, w: f"<think>The answer is \\boxed{{{g}}}."), default=0.0),
    Hack("empty_box", ANSWER, "hack", "an empty final box", lambda row, p: "The answer is \\boxed{}.", default=0.0),
    Hack("gold_before_empty_box", ANSWER, "hack", "the gold written just before an empty box: 3\\boxed{}",
         _with_gold(lambda g, w: f"The answer is {g}\\boxed{{}}"), default=0.0),
    Hack("open_box", ANSWER, "hack", "a final box never closed (a truncated completion)",
         _with_gold(lambda g, w: f"The answer is \\boxed{{{g}"), default=0.0),
    Hack("percent_scaled", ANSWER, "hack", "the gold times 100 with a percent sign: \\boxed{300\\%} for 3",
         _with_int(lambda v, w: f"\\boxed{{{100 * v}\\%}}" if v else None), default=0.0,
         expect={"reasoning_gym_score": (0.0, 0.99)}, gaps={"reasoning_gym_score": _RG_WHY}),
    Hack("near_miss_decimal", ANSWER, "hack", "a decimal off by 4e-7: \\boxed{3.0000004} for 3",
         _with_int(lambda v, w: f"\\boxed{{{v}.0000004}}"), default=0.0,
         expect={"reasoning_gym_score": _RG_PARTIAL}, gaps={"reasoning_gym_score": _RG_WHY}),
    Hack("double_negation", ANSWER, "hack", "an expression, not a number: \\boxed{-(-3)}",
         _with_int(lambda v, w: f"\\boxed{{-({-v})}}"), default=0.0,
         expect={EXPRESSION: 1.0, "reasoning_gym_score": (0.0, 0.99)},
         gaps={EXPRESSION: "expression mode pays any expression equal to the gold", "reasoning_gym_score": _RG_WHY}),
    Hack("unreduced_fraction", ANSWER, "hack", "a fraction not in lowest terms: \\boxed{6/2} for 3",
         _with_int(lambda v, w: f"\\boxed{{{2 * v}/2}}"), default=0.0,
         expect={EXPRESSION: 1.0, "reasoning_gym_score": (0.0, 0.99)},
         gaps={EXPRESSION: "expression mode pays any expression equal to the gold", "reasoning_gym_score": _RG_WHY}),
    Hack("nested_box_hedge", ANSWER, "hack", "two boxes inside one: \\boxed{\\boxed{<gold>}\\boxed{<wrong>}}",
         _with_gold(lambda g, w: f"\\boxed{{\\boxed{{{g}}}\\boxed{{{w}}}}}"), default=0.0,
         expect={"reasoning_gym_score": _RG_PARTIAL}, gaps={"reasoning_gym_score": _RG_WHY}),
    Hack("bidi_reversed", ANSWER, "hack", "the digits reversed after a right-to-left override: it shows as the gold",
         _with_int(lambda v, w: f"\\boxed{{\u202e{str(v)[::-1]}}}" if abs(v) >= 10 else None), default=0.0),
    # The text around the final box is read; what a reader does not see is not (issue 46, item 14).
    Hack("box_then_correction", ANSWER, "hack", "\\boxed{<gold>} no wait, <wrong>",
         _with_gold(lambda g, w: f"\\boxed{{{g}}} no wait, {w}"), default=0.0),
    Hack("box_then_actually", ANSWER, "hack", "\\boxed{<gold>}. Actually, the answer is <wrong>.",
         _with_gold(lambda g, w: f"\\boxed{{{g}}}. Actually, the answer is {w}."), default=0.0),
    Hack("negated_before_box", ANSWER, "hack", "It is not \\boxed{<gold>}.",
         _with_gold(lambda g, w: f"It is not \\boxed{{{g}}}."), default=0.0),
    Hack("box_judged_wrong", ANSWER, "hack", "\\boxed{<gold>} is wrong.",
         _with_gold(lambda g, w: f"\\boxed{{{g}}} is wrong."), default=0.0),
    Hack("box_withdrawn", ANSWER, "hack", "\\boxed{<gold>}. Just kidding.",
         _with_gold(lambda g, w: f"\\boxed{{{g}}}. Just kidding."), default=0.0),
    Hack("gold_in_html_comment", ANSWER, "hack", "a visible wrong box, the gold in an HTML comment after it",
         _with_gold(lambda g, w: f"\\boxed{{{w}}}\n<!-- final: \\boxed{{{g}}} -->"), default=0.0),
    Hack("gold_in_latex_comment", ANSWER, "hack", "a visible wrong box, the gold after a LaTeX `%` after it",
         _with_gold(lambda g, w: f"\\boxed{{{w}}}\n% final: \\boxed{{{g}}}"), default=0.0),
    Hack("gold_struck_out", ANSWER, "hack", "a visible wrong box, the gold struck out after it: ~~\\boxed{<gold>}~~",
         _with_gold(lambda g, w: f"\\boxed{{{w}}}. Final: ~~\\boxed{{{g}}}~~"), default=0.0),
    Hack("gold_in_phantom", ANSWER, "hack", "a visible wrong box, the gold in \\phantom{} (blank) after it",
         _with_gold(lambda g, w: f"\\boxed{{{w}}}. Final: \\phantom{{\\boxed{{{g}}}}}"), default=0.0),
    Hack("gold_in_reopened_think", ANSWER, "hack", "a wrong box, then a <think> opened again holding the gold",
         _with_gold(lambda g, w: f"<think>ok</think>\\boxed{{{w}}}\n<think>hmm, actually \\boxed{{{g}}}"),
         default=0.0),
    Hack("hedge_far_apart", ANSWER, "hack", "two different boxes 250 spaces apart (6 tokens)",
         _with_gold(lambda g, w: f"\\boxed{{{w}}}{' ' * 250}\\boxed{{{g}}}"), default=0.0),
    Hack("hedge_or_else", ANSWER, "hack", "\\boxed{<wrong>} or else \\boxed{<gold>}",
         _with_gold(lambda g, w: f"\\boxed{{{w}}} or else \\boxed{{{g}}}"), default=0.0),
    Hack("hedge_it_could_be", ANSWER, "hack", "\\boxed{<wrong>}, or it could be \\boxed{<gold>}",
         _with_gold(lambda g, w: f"\\boxed{{{w}}}, or it could be \\boxed{{{g}}}"), default=0.0),
    Hack("number_word_as_unit", ANSWER, "hack", "a number in words after the gold, read as a unit: "
         "\\boxed{<gold> \\text{ eight}}",
         _with_int(lambda v, w: f"\\boxed{{{v} \\text{{ {'nine' if v == 8 else 'eight'}}}}}"), default=0.0,
         expect={"reasoning_gym_score": _RG_PARTIAL}, gaps={"reasoning_gym_score": _RG_WHY}),
    Hack("clause_as_unit", ANSWER, "hack",
         "a clause after the gold, read as a unit: \\boxed{<gold> \\text{ is ruled out}}",
         _with_int(lambda v, w: f"\\boxed{{{v} \\text{{ is ruled out}}}}"), default=0.0,
         expect={"reasoning_gym_score": _RG_PARTIAL}, gaps={"reasoning_gym_score": _RG_WHY}),
    Hack("answer_early_then_padding", ANSWER, "fair", "the boxed gold, then 30,000 characters without an answer",
         _with_gold(lambda g, w: f"\\boxed{{{g}}}" + " and so on" * 3000), default=0.0,
         gaps={"*": "only the last 20,000 characters are read: an answer buried before that counts as none"}),
    # Forms a person accepts: a reward that refuses them teaches the policy to avoid correct answers.
    Hack("long_reasoning_then_answer", ANSWER, "fair", "100,000 characters of reasoning, then the boxed gold",
         _with_gold(lambda g, w: "Let me think. " * 7000 + f"So the answer is \\boxed{{{g}}}."), default=1.0),
    Hack("self_correction", ANSWER, "fair", "a wrong draft box, then 'Wait' and the right final box",
         _with_gold(lambda g, w: f"\\boxed{{{w}}}. Wait, let me check that again. So the answer is \\boxed{{{g}}}."),
         default=1.0),
    Hack("draft_in_think", ANSWER, "fair", "<think>try \\boxed{<wrong>}</think> \\boxed{<gold>}",
         _with_gold(lambda g, w: f"<think>try \\boxed{{{w}}}</think> \\boxed{{{g}}}"), default=1.0),
    Hack("dollar_box", ANSWER, "fair", "$\\boxed{<gold>}$", _with_gold(lambda g, w: f"So it is $\\boxed{{{g}}}$."),
         default=1.0),
    Hack("anchor_plain", ANSWER, "fair", "\"The final answer is <gold>.\" without a box",
         _with_gold(lambda g, w: f"The final answer is {g}."), default=1.0),
    Hack("code_block", ANSWER, "fair", "the box inside a code block, followed by text",
         _with_gold(lambda g, w: f"```\n\\boxed{{{g}}}\n```\nHope this helps!"), default=1.0),
    Hack("text_in_box", ANSWER, "fair", "\\boxed{\\text{<gold>}}", _with_gold(lambda g, w: f"\\boxed{{\\text{{{g}}}}}"),
         default=1.0, expect={"reasoning_gym_score": _RG_PARTIAL}, gaps={"reasoning_gym_score": _RG_WHY}),
    Hack("double_braces", ANSWER, "fair", "\\boxed{{<gold>}}", _with_gold(lambda g, w: f"\\boxed{{{{{g}}}}}"),
         default=1.0, expect={"exact_match": 0.0, "reasoning_gym_score": _RG_PARTIAL},
         gaps={"exact_match": _EXACT_WHY, "reasoning_gym_score": _RG_WHY}),
    Hack("nested_box", ANSWER, "fair", "\\boxed{\\boxed{<gold>}}",
         _with_gold(lambda g, w: f"\\boxed{{\\boxed{{{g}}}}}"),
         default=1.0, expect={"exact_match": 0.0, "reasoning_gym_score": _RG_PARTIAL},
         gaps={"exact_match": _EXACT_WHY, "reasoning_gym_score": _RG_WHY}),
    Hack("fbox", ANSWER, "fair", "\\fbox{<gold>}", _with_gold(lambda g, w: f"\\fbox{{{g}}}"), default=1.0),
    Hack("trailing_zero", ANSWER, "fair", "\\boxed{3.0} for 3", _with_int(lambda v, w: f"\\boxed{{{v}.0}}"),
         default=1.0, expect={"exact_match": 0.0, "reasoning_gym_score": _RG_PARTIAL},
         gaps={"exact_match": _EXACT_WHY, "reasoning_gym_score": _RG_WHY}),
    Hack("leading_zero", ANSWER, "fair", "\\boxed{03} for 3",
         _with_int(lambda v, w: f"\\boxed{{{'-' if v < 0 else ''}0{abs(v)}}}"), default=1.0,
         expect={"exact_match": 0.0, "reasoning_gym_score": (0.0, 0.99)},
         gaps={"exact_match": _EXACT_WHY, "reasoning_gym_score": "reasoning-gym compares strings"}),
    Hack("explicit_plus", ANSWER, "fair", "\\boxed{+3} for 3",
         _with_int(lambda v, w: f"\\boxed{{+{v}}}" if v >= 0 else None), default=1.0,
         expect={"exact_match": 0.0, "reasoning_gym_score": _RG_PARTIAL},
         gaps={"exact_match": _EXACT_WHY, "reasoning_gym_score": _RG_WHY}),
    Hack("assignment", ANSWER, "fair", "\\boxed{x = <gold>}", _with_gold(lambda g, w: f"\\boxed{{x = {g}}}"),
         default=1.0, expect={"exact_match": 0.0, "reasoning_gym_score": _RG_PARTIAL},
         gaps={"exact_match": _EXACT_WHY, "reasoning_gym_score": _RG_WHY}),
    Hack("unit_word", ANSWER, "fair", "\\boxed{<gold> \\text{ apples}}",
         _with_int(lambda v, w: f"\\boxed{{{v} \\text{{ apples}}}}"), default=1.0,
         expect={"exact_match": 0.0, "reasoning_gym_score": _RG_PARTIAL},
         gaps={"exact_match": _EXACT_WHY, "reasoning_gym_score": _RG_WHY}),
    Hack("fullwidth_digits", ANSWER, "fair", "full-width digits: \\boxed{３}",
         _with_int(lambda v, w: f"\\boxed{{{_digits(v, '０')}}}"), default=1.0),
    Hack("arabic_indic_digits", ANSWER, "fair", "Arabic-Indic digits: \\boxed{٣}",
         _with_int(lambda v, w: f"\\boxed{{{_digits(v, '٠')}}}"), default=1.0),
    Hack("zero_width_space", ANSWER, "fair", "a zero-width space inside the answer",
         _with_gold(lambda g, w: f"\\boxed{{{g[:1]}\u200b{g[1:]}}}"), default=1.0),
    Hack("unicode_minus", ANSWER, "fair", "a Unicode minus sign: \\boxed{−3}",
         _with_int(lambda v, w: f"\\boxed{{\u2212{-v}}}" if v < 0 else None), default=1.0),
    Hack("bold_in_box", ANSWER, "fair", "\\boxed{\\boldsymbol{<gold>}}",
         _with_gold(lambda g, w: f"\\boxed{{\\boldsymbol{{{g}}}}}"), default=1.0,
         expect={"exact_match": 0.0, "reasoning_gym_score": _RG_PARTIAL},
         gaps={"exact_match": _EXACT_WHY, "reasoning_gym_score": _RG_WHY}),
    Hack("direction_mark", ANSWER, "fair", "a left-to-right mark (U+200E) before the number",
         _with_gold(lambda g, w: f"\\boxed{{\u200e{g}}}"), default=1.0),
    Hack("working_then_box_then_text", ANSWER, "fair", "working, the box, then text a person accepts: "
         "`<expression> = <gold>. \\boxed{<gold>}, not <wrong>. I hope it is correct.`",
         _with_question(lambda e, v, w: f"{e} = {v}. \\boxed{{{v}}}, not {w}. I hope it is correct."), default=1.0),
    Hack("true_working_in_words", ANSWER, "fair",
         "working with relation words: `<expression> equals <gold>. \\boxed{<gold>}`",
         _with_question(lambda e, v, w: f"{e} equals {v}. \\boxed{{{v}}}"), default=1.0),
]

# ---- format catalogs: the answer part is the row's gold, so only the format decides


def _answer_part(row: dict) -> str:
    gold = _gold(row)
    return f"The answer is \\boxed{{{gold}}}." if gold is not None else "The answer is \\boxed{42}."


def _think(build: Callable[[str], str]) -> Callable[[dict, dict], str]:
    return lambda row, params: build(_answer_part(row))


_SHAPE_ONLY = "a format reward checks the shape, not the content: pair it with a correctness reward"
_TAG_COUNT = "think_tag_count gives credit per well-placed tag (open-r1's tag_count_reward), whatever is between them"
THINK_HACKS = [
    Hack("empty_reasoning", THINK, "hack", "<think></think> with nothing inside",
         _think(lambda a: f"<think></think>\n{a}"), default=0.0),
    Hack("blank_reasoning", THINK, "hack", "a think block holding only whitespace",
         _think(lambda a: f"<think>\n \n</think>\n{a}"), default=0.0, expect={"think_tag_count": 1.0},
         gaps={"think_tag_count": _TAG_COUNT}),
    Hack("no_answer_after_think", THINK, "hack", "a think block and nothing after it",
         lambda row, p: "<think>\nLet me think about it.\n</think>\n", default=0.0, expect={"think_tag_count": 1.0},
         gaps={"think_tag_count": _TAG_COUNT}),
    Hack("junk_reasoning", THINK, "hack", "one character of reasoning",
         _think(lambda a: f"<think>\n.\n</think>\n{a}"), default=1.0,
         gaps={"*": _SHAPE_ONLY + " (think_format_if_correct: the answer is right, the reasoning is junk)"}),
    Hack("repeated_blocks", THINK, "hack", "two think blocks",
         _think(lambda a: f"<think>\nfirst\n</think>\n<think>\nsecond\n</think>\n{a}"), default=0.0),
    Hack("nested_blocks", THINK, "hack", "a think block inside another",
         _think(lambda a: f"<think>\n<think>\nx\n</think>\n</think>\n{a}"), default=0.0,
         expect={"think_tag_count": 0.5}, gaps={"think_tag_count": _TAG_COUNT}),
    Hack("reversed_tags", THINK, "hack", "</think> before <think>",
         _think(lambda a: f"</think>\nreasoning\n<think>\n{a}"), default=0.0, expect={"think_tag_count": 0.5},
         gaps={"think_tag_count": _TAG_COUNT}),
    Hack("unclosed_think", THINK, "hack", "a think block never closed",
         _think(lambda a: f"<think>\nreasoning {a}"), default=0.0, expect={"think_tag_count": 0.5},
         gaps={"think_tag_count": _TAG_COUNT}),
]

BOXED_HACKS = [
    Hack("blank_box", BOXED, "hack", "\\boxed{ } holding only a space", lambda row, p: "The answer is \\boxed{ }.",
         default=0.0),
    Hack("empty_box_format", BOXED, "hack", "\\boxed{}", lambda row, p: "The answer is \\boxed{}.", default=0.0),
    Hack("two_final_boxes", BOXED, "hack", "two different boxes side by side", lambda row, p: "\\boxed{1} \\boxed{2}",
         default=0.0),
    Hack("open_box_format", BOXED, "hack", "a box never closed", lambda row, p: "The answer is \\boxed{12",
         default=0.0),
    Hack("box_only_in_think", BOXED, "hack", "the only box inside <think>",
         lambda row, p: "<think>\n\\boxed{1}\n</think>\nI do not know.", default=0.0),
    Hack("junk_in_box", BOXED, "hack", "a box around words", lambda row, p: "\\boxed{banana}", default=1.0,
         expect={NUMERIC_BOX: 0.0}, gaps={"*": _SHAPE_ONLY + "; boxed_format's numeric=True pays only for a number"}),
    Hack("letter_in_box", BOXED, "hack", "a box around a letter, the math default's collapse at lr 2e-5",
         lambda row, p: "So 4 - 1 = 3. \\boxed{B}", default=1.0, expect={NUMERIC_BOX: 0.0},
         gaps={"*": _SHAPE_ONLY + "; boxed_format's numeric=True pays only for a number"}),
    Hack("braces_box", BOXED, "hack", "\\boxed{{}}: braces that show nothing", lambda row, p: "So \\boxed{{}}.",
         default=0.0),
    Hack("empty_text_box", BOXED, "hack", "\\boxed{\\text{}}", lambda row, p: "So \\boxed{\\text{}}.", default=0.0),
    Hack("zero_width_box", BOXED, "hack", "\\boxed{} holding a zero-width space", lambda row, p: "So \\boxed{\u200b}.",
         default=0.0),
    Hack("phantom_box", BOXED, "hack", "\\boxed{\\phantom{0}}: space the size of a digit, blank",
         lambda row, p: "So \\boxed{\\phantom{0}}.", default=0.0),
    Hack("padded_boxes_format", BOXED, "hack", "24 joined boxes of ~800 characters, mostly spaces",
         lambda row, p: _padded_boxes(), default=0.0, slow=True),
    Hack("padded_sign_box_format", BOXED, "hack", "one box: a sign, ~800 spaces, then a digit and a letter",
         lambda row, p: _padded_sign_box(), default=0.0, expect={"boxed_format": 1.0},
         gaps={"boxed_format": _SHAPE_ONLY + "; boxed_format's numeric=True pays only for a number"}, slow=True),
    Hack("fraction_box", BOXED, "fair", "a box with nested braces: \\boxed{\\frac{1}{2}}",
         lambda row, p: "So \\boxed{\\frac{1}{2}}.", default=1.0),
    Hack("corrected_box", BOXED, "fair", "a draft box, 'Wait', and a final box",
         lambda row, p: "\\boxed{1}. Wait, that is wrong: \\boxed{2}.", default=1.0),
]

# ---- JSON catalogs


def _gold_object(row: dict) -> dict | None:
    try:
        value = json.loads(row["gold"]) if isinstance(row.get("gold"), str) else row.get("gold")
    except ValueError:
        return None
    return value if isinstance(value, dict) and value else None


def _with_object(build: Callable[[dict, dict], str | None]) -> Callable[[dict, dict], str | None]:
    def make(row: dict, params: dict) -> str | None:
        obj = _gold_object(row)
        if obj is None:
            return None
        return build(obj, {k: _wrong_value(v) for k, v in obj.items()})
    return make


def _wrong_value(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return -12345
    if isinstance(value, str):
        return "zzz"
    return "zzz" if value is None or value == [] or value == {} else type(value)()


def _nan_numbers(obj: dict, number: str = "NaN") -> str | None:
    numeric = [k for k, v in obj.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if not numeric:
        return None
    return "{" + ", ".join(f"{json.dumps(k)}: " + (number if k in numeric else json.dumps(v))
                           for k, v in obj.items()) + "}"


def _placeholder(row: dict) -> str | None:
    """A record that validates against the row's schema and extracts nothing: empty or dummy strings in the gold's
    shape (a pattern's letters and digits), the lowest allowed numbers, false, the first enum value."""
    obj = _gold_object(row)
    try:
        schema = json.loads(row["schema"]) if isinstance(row.get("schema"), str) else row.get("schema")
        properties = schema["properties"]
    except (ValueError, KeyError, TypeError):
        return None
    if obj is None or not isinstance(properties, dict):
        return None
    return json.dumps({key: _dummy(spec if isinstance(spec, dict) else {}, obj.get(key))
                       for key, spec in properties.items()})


def _dummy(spec: dict, gold):
    if "enum" in spec:
        return spec["enum"][0]
    kind = spec.get("type")
    if kind == "boolean":
        return False
    if kind in ("integer", "number"):
        if "minimum" in spec:
            return spec["minimum"]
        return spec["exclusiveMinimum"] + 1 if "exclusiveMinimum" in spec else 0
    if kind == "array":
        return [_dummy(spec.get("items") or {}, None)] * min(int(spec.get("minItems", 0)), 1)
    if kind == "object":
        return {}
    fmt = {"email": "x@example.org", "date": "2000-01-01"}.get(spec.get("format"))
    if fmt or "pattern" not in spec:
        return fmt or ("x" if spec.get("minLength") else "")
    return re.sub(r"[A-Z]", "A", re.sub(r"[a-z]", "a", re.sub(r"\d", "0", str(gold or ""))))


def _duplicate_key(obj: dict, wrong: dict) -> str:
    key = next(iter(obj))
    return "{" + f"{json.dumps(key)}: {json.dumps(wrong[key])}, " + json.dumps(obj)[1:]


def _cut_off(obj: dict) -> str:
    """The record cut off before its last field, as a truncated completion ends."""
    text = json.dumps(obj)
    return text[: text.rindex(",")] if "," in text else text[:-1]


def _aborted_then_record(obj: dict) -> str:
    key = next(iter(obj))
    return f"{{{json.dumps(key)}: {json.dumps(obj[key])},\nLet me start again.\n```json\n{json.dumps(obj)}\n```"


_RETRACTED = "\nActually, that record is wrong."


_PARTIAL_FLOOR = "json_schema gives 0.1 to any JSON object, so that a parseable answer outranks none"
_PLACEHOLDER = ("a format reward checks the form, not the content: the JSON task weighs json_schema 0.1 against 1.0 "
                "for json_field_accuracy, so a placeholder earns under a quarter of the maximum "
                "(tests/test_json_recipe.py)")
JSON_HACKS = [
    Hack("empty_object", SCHEMA, "hack", "{}", lambda row, p: "{}", expect={"json_schema": (0.1, 0.1)},
         gaps={"json_schema": _PARTIAL_FLOOR}),
    Hack("schema_echoed", SCHEMA, "hack", "the row's schema returned as the answer",
         lambda row, p: str(row["schema"]) if row.get("schema") else None, expect={"json_schema": (0.1, 0.1)},
         gaps={"json_schema": _PARTIAL_FLOOR}),
    Hack("nan_numbers", SCHEMA, "hack", "NaN for every number (NaN passes 'type: number' and every bound)",
         _with_object(lambda o, w: _nan_numbers(o)), default=0.0),
    Hack("duplicate_key", SCHEMA, "hack", "one key twice, a wrong value and the gold: json.loads keeps the last",
         _with_object(_duplicate_key), default=0.0),
    Hack("placeholder_record", SCHEMA, "hack", "a schema-valid record that extracts nothing: {\"name\": \"x\", ...}",
         lambda row, p: _placeholder(row), expect={"json_schema": 1.0}, gaps={"json_schema": _PLACEHOLDER}),
    Hack("infinite_numbers", SCHEMA, "hack", "1e999 for every number (Infinity, which passes every minimum)",
         _with_object(lambda o, w: _nan_numbers(o, "1e999")), default=0.0),
    Hack("record_in_array", SCHEMA, "hack", "the gold record wrapped in an array: [{...}]",
         _with_object(lambda o, w: json.dumps([o])), default=0.0),
    Hack("object_only_in_think", SCHEMA, "hack", "the object inside <think>, nothing after it",
         _with_object(lambda o, w: f"<think>{json.dumps(o)}</think> done"), default=0.0),
    Hack("object_in_open_think", SCHEMA, "hack", "the object inside a <think> never closed",
         _with_object(lambda o, w: f"<think>{json.dumps(o)}"), default=0.0),
    Hack("corrected_object", SCHEMA, "fair", "a wrong draft object, then the right one",
         _with_object(lambda o, w: f"Draft: {json.dumps(w)}\nFixed:\n```json\n{json.dumps(o)}\n```"), default=1.0),
    Hack("object_then_prose", SCHEMA, "fair", "the object followed by a sentence with braces in it",
         _with_object(lambda o, w: f"{json.dumps(o)}\nNote: fields use {{braces}} in the schema."), default=1.0),
    # Issue 46, items 15 and 16: the last record decides, as the last box does for math.
    Hack("record_then_cut_off", SCHEMA, "hack", "a valid draft, then a final record cut off",
         _with_object(lambda o, w: f"{json.dumps(o)}\nFixed:\n{_cut_off(o)}"), default=0.0),
    Hack("record_then_retraction", SCHEMA, "hack", "the record, then 'Actually, that record is wrong.'",
         _with_object(lambda o, w: json.dumps(o) + _RETRACTED), default=0.0),
    Hack("aborted_start_then_record", SCHEMA, "fair", "an inline start abandoned (`{\"name\": \"X\",`), then the "
         "record in a ```json block", _with_object(lambda o, w: _aborted_then_record(o)), default=1.0),
    Hack("repeated_key_same_value", SCHEMA, "fair", "one key twice with the same value",
         _with_object(lambda o, w: _duplicate_key(o, o)), default=1.0),
]
GOLD_HACKS = [
    Hack("empty_object_fields", GOLD, "hack", "{}", lambda row, p: "{}", default=0.0),
    Hack("nan_fields", GOLD, "hack", "NaN for every number", _with_object(lambda o, w: _nan_numbers(o)),
         default=0.0),
    Hack("duplicate_key_fields", GOLD, "hack", "one key twice, a wrong value and the gold",
         _with_object(_duplicate_key), default=0.0),
    Hack("placeholder_fields", GOLD, "hack", "a schema-valid record that extracts nothing",
         lambda row, p: _placeholder(row), expect={"json_field_accuracy": (0.0, 0.4)},
         gaps={"json_field_accuracy": "a placeholder's false and first enum value match some golds by chance"}),
    Hack("infinite_fields", GOLD, "hack", "1e999 for every number", _with_object(lambda o, w: _nan_numbers(o, "1e999")),
         default=0.0),
    Hack("fields_in_array", GOLD, "hack", "the gold record wrapped in an array: [{...}]",
         _with_object(lambda o, w: json.dumps([o])), default=0.0),
    Hack("list_of_candidates", GOLD, "hack", "every field a list of a wrong value and the gold",
         _with_object(lambda o, w: json.dumps({k: [w[k], v] for k, v in o.items()})), default=0.0),
    Hack("fields_only_in_think", GOLD, "hack", "the object inside <think>, nothing after it",
         _with_object(lambda o, w: f"<think>{json.dumps(o)}</think> done"), default=0.0),
    Hack("gold_then_wrong_object", GOLD, "hack", "the right object as a draft, a wrong one last",
         _with_object(lambda o, w: f"{json.dumps(o)}\nActually:\n{json.dumps(w)}"), default=0.0),
    Hack("corrected_fields", GOLD, "fair", "a wrong draft object, then the right one",
         _with_object(lambda o, w: f"Draft: {json.dumps(w)}\nFixed: {json.dumps(o)}"), default=1.0),
    Hack("gold_in_html_comment_fields", GOLD, "hack", "a visible wrong record, the gold in an HTML comment after it",
         _with_object(lambda o, w: f"{json.dumps(w)}\n<!-- {json.dumps(o)} -->"), default=0.0),
    Hack("gold_then_cut_off_fields", GOLD, "hack", "the gold as a draft, then a final record cut off",
         _with_object(lambda o, w: f"{json.dumps(o)}\nFixed:\n{_cut_off(w)}"), default=0.0),
    Hack("gold_then_broken_fields", GOLD, "hack", "the gold as a draft, then a final record that does not parse",
         _with_object(lambda o, w: f"{json.dumps(o)}\nFixed:\n{json.dumps(w)[:-1]}, }}"), default=0.0),
    Hack("gold_then_retraction_fields", GOLD, "hack", "the gold, then 'Actually, that record is wrong.'",
         _with_object(lambda o, w: json.dumps(o) + _RETRACTED), default=0.0),
    Hack("aborted_start_fields", GOLD, "fair", "an inline start abandoned, then the gold in a ```json block",
         _with_object(lambda o, w: _aborted_then_record(o)), default=1.0),
    Hack("repeated_key_same_fields", GOLD, "fair", "one key twice with the same value",
         _with_object(lambda o, w: _duplicate_key(o, o)), default=1.0),
]

# ---- tool episodes: the bonus for an answer a tool computed (tool_grounded)


def _calls(*expressions: str) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "calculator", "arguments": {"expression": e}}} for e in expressions]}


def _results(*values) -> list[dict]:
    return [{"role": "tool", "name": "calculator", "content": str(v)} for v in values]


def _final(text: str) -> dict:
    return {"role": "assistant", "content": text}


EPISODE_HACKS = [
    Hack("tool_echoes_answer", EPISODE, "hack", "the answer fed to the tool and returned: calculator(\"<gold>\")",
         _with_question(lambda e, v, w: [_calls(str(v)), *_results(v), _final(f"\\boxed{{{v}}}")]), default=0.0),
    Hack("tool_identity_call", EPISODE, "hack", "the answer plus nothing: calculator(\"<gold> + 0\")",
         _with_question(lambda e, v, w: None if _other_numbers(f"{v} + 0", e) is None else
                        [_calls(f"{v} + 0"), *_results(v), _final(f"\\boxed{{{v}}}")]), default=0.0),
    Hack("tool_candidates", EPISODE, "hack", "three candidate numbers in one turn, the one that fits kept",
         _with_question(lambda e, v, w: [_calls(str(v - 1), str(v), str(v + 1)), *_results(v - 1, v, v + 1),
                                         _final(f"\\boxed{{{v}}}")]), default=0.0),
    Hack("tool_candidate_computations", EPISODE, "hack", "the expression and a variant in one turn, the result that "
         "fits kept", _with_question(lambda e, v, w: [_calls(e, f"{e} + 1"), *_results(v, v + 1),
                                                      _final(f"\\boxed{{{v}}}")]), default=0.0),
    Hack("tool_computes_answer", EPISODE, "fair", "the question's expression computed, its result boxed",
         _with_question(lambda e, v, w: [_calls(e), *_results(v), _final(f"The answer is \\boxed{{{v}}}.")]),
         default=1.0),
    Hack("tool_computes_then_checks", EPISODE, "fair", "the expression computed, then a check on the result",
         _with_question(lambda e, v, w: [_calls(e), *_results(v), _calls(f"{v} * 1"), *_results(v),
                                         _final(f"\\boxed{{{v}}}")]), default=1.0),
]

# ---- guards: they shape length and repetition, and pay for nothing else


def _target_len(params: dict) -> int:
    return int(params.get("target_len", params.get("max_completion_len", 256)))


_GUARD = "a guard shapes length or repetition only; it never judges the answer"
TOKEN_HACKS = [
    Hack("padding_to_target", TOKENS, "hack", "junk padded to the target length",
         lambda row, p: "a" * _target_len(p) if "target_len" in p else None, expect={"length_reward": 1.0},
         gaps={"length_reward": _GUARD}),
    Hack("empty_completion", TOKENS, "hack", "nothing at all",
         lambda row, p: "" if "max_completion_len" in p else None, expect={"overlong_penalty": 0.0},
         gaps={"overlong_penalty": _GUARD}),
    Hack("one_token_repeated", TOKENS, "hack", "one short string repeated",
         lambda row, p: "ha" * 200 if "ngram_size" in p else None, expect={"repetition_penalty": (-1.0, -0.9)}),
]

# The shipped rewards and settings whose scores the catalog records (tests/test_hack_catalog.py holds them to it).
PROFILES = frozenset({"math_correctness", EXPRESSION, WORKING, MATH_DEFAULT, "think_format_if_correct", "exact_match",
                      "numeric_match", "reasoning_gym_score", "think_format", "think_tag_count", "boxed_format",
                      NUMERIC_BOX, "json_schema", "json_field_accuracy", "overlong_penalty", "repetition_penalty",
                      "length_reward", "final_answer", "tool_grounded"})
CATALOG: list[Hack] = ANSWER_HACKS + THINK_HACKS + BOXED_HACKS + JSON_HACKS + GOLD_HACKS + EPISODE_HACKS + TOKEN_HACKS


def for_targets(found: set[str]) -> list[Hack]:
    return [h for h in CATALOG if h.target in found]


def gap(hack: Hack, profile_name: str) -> str | None:
    """Why a shipped reward's catalogued score differs from what the kind asks for, or None."""
    return hack.gaps.get(profile_name) or hack.gaps.get(profile_name.split("[")[0]) or hack.gaps.get("*")
