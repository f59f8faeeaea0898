"""Math rewards: answer correctness through math-verify, and the think-tag format."""

from __future__ import annotations

import logging
import re
import threading

from grpo_recipes.registry import reward

logging.getLogger("math_verify").setLevel(logging.ERROR)  # it logs every timeout and unparseable string

_MAX_CHARS = 20_000  # parsing cost grows with length; an answer lives near the end of a completion


def _parsers(require_boxed: bool):
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    latex = LatexExtractionConfig(
        normalization_config=NormalizationConfig(units=True),
        boxed_match_priority=0,  # a \boxed{} answer wins over any other expression in the text
        try_extract_without_anchor=not require_boxed,
    )
    return [latex] if require_boxed else [latex, ExprExtractionConfig()]


def _timeouts(seconds: int) -> int | None:
    # math-verify enforces timeouts with SIGALRM, which exists only in the main thread.
    return seconds if threading.current_thread() is threading.main_thread() else None


@reward("math_correctness")
def math_correctness(
    completions: list[str],
    answer: list[str],
    log_metric,
    *,
    require_boxed: bool = False,
    timeout_s: int = 3,
) -> list[float | None]:
    """1.0 when the completion's answer (\\boxed{} first) equals the gold answer under math-verify, else 0.0; None when the gold cannot be parsed."""
    from math_verify import parse, verify

    timeout = _timeouts(int(timeout_s))
    scores: list[float | None] = []
    unparseable_gold = 0
    for text, gold in zip(completions, answer, strict=True):
        gold_parsed = parse(str(gold), parsing_timeout=timeout)
        if not gold_parsed:
            unparseable_gold += 1
            scores.append(None)  # an unscorable row teaches nothing; 0 or 1 here would be a lie
            continue
        tail = text[-_MAX_CHARS:]
        pred = parse(tail, extraction_config=_parsers(require_boxed), extraction_mode="first_match",
                     parsing_timeout=timeout)
        ok = bool(pred) and verify(gold_parsed, pred, timeout_seconds=timeout)
        scores.append(1.0 if ok else 0.0)
    log_metric("gold_unparseable", unparseable_gold / max(len(answer), 1))
    return scores


def _think_ok(text: str, strict: bool) -> bool:
    # Plain string scans, not a regex with backtracking: completions can be megabytes of tags.
    if text.count("<think>") != 1 or text.count("</think>") != 1:
        return False
    open_at, close_at = text.find("<think>"), text.find("</think>")
    reasoning, answer = text[open_at + 7 : close_at], text[close_at + 8 :]
    if close_at < open_at or not reasoning.strip() or not answer.strip():
        return False
    if strict:
        return not text[:open_at].strip() and reasoning.startswith("\n") and reasoning.endswith("\n") \
            and answer.startswith("\n")
    return True


@reward("think_format")
def think_format(completions: list[str], *, strict: bool = False) -> list[float]:
    """1.0 when the reasoning is in one <think>...</think> block followed by a non-empty answer (strict: newline-delimited, nothing before)."""
    return [1.0 if _think_ok(text, strict) else 0.0 for text in completions]


@reward("boxed_format")
def boxed_format(completions: list[str]) -> list[float]:
    """1.0 when the completion puts exactly one final answer in \\boxed{...}, else 0.0."""
    return [1.0 if text.count("\\boxed{") == 1 and re.search(r"\\boxed\{[^{}]+\}", text) else 0.0
            for text in completions]
