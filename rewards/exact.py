"""Correctness by string or number, and reasoning-gym's own scorers.

The answer is read as grpo_recipes/answers.py says (the math rewards read it the same way): only the visible text
after the last </think> (nothing, if a <think> is left open or opened again); there, the final \\boxed{...} (a hedge of
differing boxes, a last box left open, or one the text around it takes back, is no answer); else the last
<answer>...</answer> (none if the text after it takes it back); else the last non-empty line, minus a leading
"answer:" / "final answer:" / "the answer is" and a final period. Full-width and other scripts' digits, Unicode minus
signs, zero-width characters and direction marks are read as their plain forms. numeric_match then reads that
answer as one number literal, which may sit in a sentence ("42 apples", "So she has 42"), but never among other
numbers ("3 or 5", "5 - 3 = 2").
"""

from __future__ import annotations

import functools
import json
import math
import re
from fractions import Fraction
from typing import Annotated

from grpo_recipes.rewards import Range, answers, reward

_PREFIX = re.compile(r"^(?:\*\*)?(?:final answer|answer|the (?:final )?answer is)\s*[:=]?\s*(?:\*\*)?", re.I)


def extract_answer(text: str) -> str | None:
    text = answers.answer_region(text)
    if text is None:
        return None
    group = answers.final_box_group(text)
    if group is not None:
        one = answers.single_answer(group)  # None for a hedge or a box left open: no answer
        return None if one is None else answers.normalize_text(one).strip()
    end = text.rfind("</answer>")
    start = text.rfind("<answer>", 0, end) if end >= 0 else -1
    if start >= 0:
        inner = text[start + 8 : end]
        return None if answers.retracted(text[end + 9 :], inner) else answers.normalize_text(inner).strip()
    line = answers.last_line(text)
    # The sentence's final period is not part of the answer ("The answer is 42.").
    return None if line is None else answers.normalize_text(_PREFIX.sub("", line)).strip().removesuffix(".").strip()


def normalize(answer: str) -> str:
    """Plain Unicode forms, casefold, unwrap \\text{}, drop $, surrounding quotes and a final period, squash spaces."""
    answer = re.sub(r"\\text\{([^{}]*)\}", r"\1", answers.normalize_text(answer)).replace("$", "")
    answer = " ".join(answer.split()).casefold()
    return answer.strip("\"'`").rstrip(".").strip()


def parse_number(text: str, gold: bool = False) -> Fraction | None:
    """The one number literal `text` states (grpo_recipes/answers.py), possibly inside a sentence, as an exact Fraction.

    A gold may be a fraction in any terms (2/4); an answer's fraction must be in lowest terms, as for math_correctness.
    """
    literal = answers.parse_literal(text, words=True, lowest_terms=not gold)
    return None if literal is None else literal.value


@reward("exact_match")
def exact_match(completions: list[str], answer: list[str], log_metric) -> list[float | None]:
    """1.0 when the extracted answer equals the gold after normalisation (case, spacing, $, \\text{}, final period)."""
    scores: list[float | None] = []
    no_answer = 0
    for text, gold in zip(completions, answer, strict=True):
        gold_norm = normalize(str(gold))
        if not gold_norm:
            scores.append(None)
            continue
        pred = extract_answer(text)
        no_answer += pred is None
        scores.append(1.0 if pred is not None and normalize(pred) == gold_norm else 0.0)
    n = max(len(completions), 1)
    log_metric("gold_empty", sum(s is None for s in scores) / n)
    log_metric("no_answer", no_answer / n)
    return scores


@reward("numeric_match")
def numeric_match(
    completions: list[str],
    answer: list[str],
    log_metric,
    *,
    rel_tol: Annotated[float, Range(ge=0)] = 0.0,
    abs_tol: Annotated[float, Range(ge=0)] = 0.0,
) -> list[float | None]:
    """1.0 when the extracted answer is one number equal to the gold's (exactly by default; rel_tol/abs_tol loosen it); None when the gold is not a number."""
    scores: list[float | None] = []
    no_number = 0
    for text, gold in zip(completions, answer, strict=True):
        gold_value = parse_number(str(gold), gold=True)
        if gold_value is None:
            scores.append(None)
            continue
        pred = extract_answer(text)
        value = None if pred is None else parse_number(pred)
        no_number += value is None
        # Exact rationals: a float's relative tolerance would pass 106475279602 for 106475279601.
        ok = value is not None and abs(value - gold_value) <= max(rel_tol * abs(gold_value), abs_tol)
        scores.append(1.0 if ok else 0.0)
    n = max(len(completions), 1)
    log_metric("gold_not_numeric", sum(s is None for s in scores) / n)
    log_metric("no_number", no_number / n)
    return scores


@functools.lru_cache(maxsize=None)
def _gym_scorer(source_dataset: str):
    import reasoning_gym

    return reasoning_gym.get_score_answer_fn(source_dataset)


def _gym_entry(raw, answer) -> dict | None:
    try:
        entry = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return None
    if not isinstance(entry, dict) or not isinstance(entry.get("metadata"), dict):
        return None
    return {**entry, "answer": entry.get("answer", answer)}


@reward("reasoning_gym_score")
def reasoning_gym_score(completions: list[str], answer: list[str], gym_entry: list, log_metric) -> list[float | None]:
    """reasoning-gym's own score_answer for the row's task (metadata.source_dataset) on the extracted answer; None when the entry cannot be scored."""
    scores: list[float | None] = []
    unscorable = 0
    for text, gold, raw in zip(completions, answer, gym_entry, strict=True):
        entry = _gym_entry(raw, gold)
        try:
            scorer = _gym_scorer(str(entry["metadata"]["source_dataset"])) if entry else None
            score = None if scorer is None else float(scorer(extract_answer(text), entry))
        except Exception:  # noqa: BLE001 - task scorers raise on odd answers or stringified metadata; counted below
            score = None
        if score is not None and not math.isfinite(score):
            score = None
        unscorable += score is None
        scores.append(score)
    log_metric("unscorable", unscorable / max(len(completions), 1))
    return scores
