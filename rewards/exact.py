"""Correctness by string or number, and reasoning-gym's own scorers.

The answer is taken from the text after the last </think> (nothing, if a <think> is left open), in this order:
the last balanced \\boxed{...}; else the last <answer>...</answer>; else the last non-empty line, minus a leading
"answer:" / "final answer:" / "the answer is". numeric_match then reads the number in that answer (the last one,
when the answer is a sentence such as "42 apples").
"""

from __future__ import annotations

import functools
import json
import math
import re
from fractions import Fraction

from grpo_recipes.registry import reward

_MAX_CHARS = 20_000  # the answer is at the end; bounding the scan keeps 1 MB completions cheap
_MAX_NUMBER = 1000
_PREFIX = re.compile(r"^(?:\*\*)?(?:final answer|answer|the (?:final )?answer is)\s*[:=]?\s*(?:\*\*)?", re.I)
_NUMBER = re.compile(r"[-+]?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?")
_BRACES = re.compile(r"[{}]")
_FRACTION = re.compile(r"\s*([-+]?)\s*(?:\\[dt]?frac\{\s*(\d+)\s*\}\{\s*(\d+)\s*\}|(\d+)\s*/\s*(\d+))\s*")


def _last_boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth = 1
    for m in _BRACES.finditer(text, start + 7):
        depth += 1 if m.group() == "{" else -1
        if depth == 0:
            return text[start + 7 : m.start()]
    return None  # unbalanced: no boxed answer


def extract_answer(text: str) -> str | None:
    close = text.rfind("</think>")
    if close >= 0:
        text = text[close + 8 :]
    elif "<think>" in text:
        return None
    text = text[-_MAX_CHARS:]
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    end = text.rfind("</answer>")
    start = text.rfind("<answer>", 0, end) if end >= 0 else -1
    if start >= 0:
        return text[start + 8 : end].strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return _PREFIX.sub("", lines[-1]).strip() if lines else None


def normalize(answer: str) -> str:
    """Casefold, unwrap \\text{}, drop $ and surrounding quotes / final period, collapse whitespace."""
    answer = re.sub(r"\\text\{([^{}]*)\}", r"\1", answer).replace("$", "")
    answer = " ".join(answer.split()).casefold()
    return answer.strip("\"'`").rstrip(".").strip()


def parse_number(text: str) -> Fraction | None:
    """A number, a/b or \\frac{a}{b}, with thousands commas; for other text, its last number. Exact, as a Fraction.

    Numbers of over 1000 characters or with |exponent| > 1000 count as no number: no answer looks like that, int()
    refuses 4300+ digits, and exact arithmetic on 10**huge would stall the trainer.
    """
    frac = _FRACTION.fullmatch(text) if len(text) <= _MAX_NUMBER else None
    if frac:
        sign, *parts = frac.groups()
        num, den = (int(p) for p in parts if p is not None)
        return None if den == 0 else Fraction(num, den) * (-1 if sign == "-" else 1)
    numbers = _NUMBER.findall(text[-_MAX_CHARS:])
    token = numbers[-1].replace(",", "") if numbers else ""
    if not token or len(token) > _MAX_NUMBER:
        return None
    _, _, exponent = token.lower().partition("e")
    return None if exponent and abs(int(exponent)) > 1000 else Fraction(token)


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
    completions: list[str], answer: list[str], log_metric, *, rel_tol: float = 0.0, abs_tol: float = 0.0
) -> list[float | None]:
    """1.0 when the extracted answer's number equals the gold's (exactly by default; rel_tol/abs_tol loosen it); None when the gold has no number."""
    scores: list[float | None] = []
    no_number = 0
    for text, gold in zip(completions, answer, strict=True):
        gold_value = parse_number(str(gold))
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
