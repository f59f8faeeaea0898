"""Math rewards: answer correctness through math-verify (with an exact fast path), and the think-tag formats."""

from __future__ import annotations

import functools
import logging
import re
import threading
from decimal import Decimal

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


@functools.lru_cache(maxsize=4096)
def _parse_gold(gold: str, timeout: int | None):
    # A GRPO batch repeats each gold once per generation; parsing it once saves most of the sympy work.
    from math_verify import parse

    return tuple(parse(gold, parsing_timeout=timeout))


def _verify_slow(text: str, gold: str, require_boxed: bool, timeout: int | None) -> bool | None:
    """math-verify's verdict: None when the gold cannot be parsed. This is the reference the fast path must match."""
    from math_verify import parse, verify

    gold_parsed = _parse_gold(gold, timeout)
    if not gold_parsed:
        return None
    pred = parse(text[-_MAX_CHARS:], extraction_config=_parsers(require_boxed), extraction_mode="first_match",
                 parsing_timeout=timeout)
    return bool(pred) and verify(list(gold_parsed), pred, timeout_seconds=timeout)


# The fast path only answers when it can prove what math-verify would say. Plain numbers, with thousands grouped by
# commas in threes (math-verify reads "1,000" as 1000 but "1,5" as 1.5 in a gold and as the set {1, 5} in a box).
_NUM = r"-?(?:0|[1-9]\d*|[1-9]\d{0,2}(?:,\d{3})+)(?:\.\d+)?"
_GOLD_NUM = re.compile(rf"\s*(?:\\boxed\{{({_NUM})\}}|\$({_NUM})\$?|({_NUM}))\s*")
_BOXED_NUM = re.compile(rf"\s*\+?({_NUM})\s*")
# After the box, any of these could start a match math-verify ranks above the box: a closing `}` extends the
# greedy `\boxed{.+}`, a math delimiter closes an environment around it, a percent sign or word turns the
# environment into a percentage, "I hope" ends its "final answer is" pattern.
_AFTER_BOX_UNSAFE = re.compile(r"[}$\]\\%]|I hope|[Pp]ercent|[Pp]ct")
# An environment holding nothing but the box ("The final answer is $\boxed{42}$") extracts the box's content.
_ENVS = (("$$", "$$"), ("$", "$"), ("\\[", "\\]"), ("\\(", "\\)"))


def _after_box(tail: str, start: int, end: int) -> str:
    before, after = tail[:start].rstrip(), tail[end + 1 :].lstrip()
    for opening, closing in _ENVS:
        if before.endswith(opening) and after.startswith(closing):
            return after[len(closing) :]
    return tail[end + 1 :]


def _fast_verdict(text: str, gold: str) -> bool | None:
    """True/False when the verdict is certain without sympy; None means "ask math-verify"."""
    g = _GOLD_NUM.fullmatch(gold)
    if g is None:
        return None
    tail = text[-_MAX_CHARS:]
    start = tail.find("\\boxed{")
    if start < 0 or tail.find("\\boxed{", start + 7) >= 0:
        return None
    end = tail.find("}", start + 7)
    if end < 0 or _AFTER_BOX_UNSAFE.search(_after_box(tail, start, end)):
        return None
    p = _BOXED_NUM.fullmatch(tail, start + 7, end)
    if p is None:
        return None
    gs, ps = next(x for x in g.groups() if x is not None), p.group(1)
    gv, pv = Decimal(gs.replace(",", "")), Decimal(ps.replace(",", ""))
    if "." not in gs and "." not in ps:
        return gv == pv  # sympy Integers compare exactly, at any size
    # With a decimal point math-verify compares 15-digit Floats rounded to 6 places: decide only far from that edge.
    if max(len(gs), len(ps)) > 15 or max(abs(gv), abs(pv)) >= 10**6:
        return None
    if gv == pv:
        return True
    return False if abs(gv - pv) > Decimal("1e-5") else None


def _correct(text: str, gold: str, require_boxed: bool, timeout: int | None) -> tuple[bool | None, bool]:
    """(verdict, answered by the fast path)."""
    verdict = _fast_verdict(text, gold)
    if verdict is not None:
        return verdict, True
    return _verify_slow(text, gold, require_boxed, timeout), False


@reward("math_correctness")
def math_correctness(
    completions: list[str],
    answer: list[str],
    log_metric,
    *,
    require_boxed: bool = True,
    timeout_s: int = 3,
) -> list[float | None]:
    """1.0 when the completion's \\boxed{} (or "final answer is") answer equals the gold under math-verify, else 0.0; None when the gold cannot be parsed.

    require_boxed=False also takes the first bare expression in the text. Do not use it on tasks whose question is
    an expression: "To calculate 4 + -8, ..." then scores as the answer -4. A GRPO run of the math default learned
    exactly that restatement within ten steps (bench/README.md)."""
    timeout = _timeouts(int(timeout_s))
    scores: list[float | None] = []
    fast = 0
    for text, gold in zip(completions, answer, strict=True):
        verdict, was_fast = _correct(text, str(gold), require_boxed, timeout)
        fast += was_fast
        scores.append(None if verdict is None else float(verdict))  # None: an unscorable row teaches nothing
    n = max(len(scores), 1)
    log_metric("gold_unparseable", sum(s is None for s in scores) / n)
    log_metric("fast_path_rate", fast / n)
    return scores


def _split_think(text: str, template_opens_think: bool) -> tuple[str, str, str] | None:
    """(before, reasoning, answer) when the text has exactly one well-ordered think block, else None.

    Plain string scans, not a regex with backtracking: completions can be megabytes of tags.
    """
    if template_opens_think:
        # The chat template already wrote "<think>" into the prompt: the completion starts inside the block.
        if "<think>" in text:
            return None
        text = "<think>" + text
    if text.count("<think>") != 1 or text.count("</think>") != 1:
        return None
    open_at, close_at = text.find("<think>"), text.find("</think>")
    if close_at < open_at:
        return None
    return text[:open_at], text[open_at + 7 : close_at], text[close_at + 8 :]


def _think_ok(text: str, strict: bool, template_opens_think: bool = False) -> bool:
    parts = _split_think(text, template_opens_think)
    if parts is None:
        return False
    before, reasoning, answer = parts
    if not reasoning.strip() or not answer.strip():
        return False
    if strict:
        # The template's own "<think>\n" supplies the leading newline when it opens the block.
        opens_on_newline = template_opens_think or reasoning.startswith("\n")
        return not before.strip() and opens_on_newline and reasoning.endswith("\n") and answer.startswith("\n")
    return True


@reward("think_format", role="format")
def think_format(completions: list[str], *, strict: bool = False, template_opens_think: bool = False) -> list[float]:
    """1.0 when the reasoning is in one <think>...</think> block followed by a non-empty answer (strict: newline-delimited, nothing before)."""
    return [1.0 if _think_ok(text, strict, template_opens_think) else 0.0 for text in completions]


@reward("think_tag_count", role="format")
def think_tag_count(
    completions: list[str], *, answer_tags: bool = False, template_opens_think: bool = False
) -> list[float]:
    """Partial credit per well-placed tag (open-r1's tag_count_reward): <think>, </think>, and with answer_tags <answer>, </answer>."""
    tags = ["<think>\n", "\n</think>\n"] + (["\n<answer>\n", "\n</answer>"] if answer_tags else [])
    share = 1.0 / len(tags)
    scores = []
    for text in completions:
        score = 0.0
        for tag in tags:
            if tag == "<think>\n" and template_opens_think:
                score += share if "<think>" not in text else 0.0  # the template wrote it; a second one is wrong
            elif text.count(tag) == 1:
                score += share
        scores.append(score)
    return scores


@reward("think_format_if_correct")
def think_format_if_correct(
    completions: list[str],
    answer: list[str],
    log_metric,
    *,
    strict: bool = False,
    template_opens_think: bool = False,
    require_boxed: bool = True,
    timeout_s: int = 3,
) -> list[float | None]:
    """1.0 when the think format holds and the answer after </think> is correct (math_correctness); None when the gold cannot be parsed."""
    timeout = _timeouts(int(timeout_s))
    scores: list[float | None] = []
    formatted = 0
    for text, gold in zip(completions, answer, strict=True):
        if not _think_ok(text, strict, template_opens_think):
            scores.append(0.0)  # format fails: no need to pay for verification
            continue
        formatted += 1
        answer_part = text[text.find("</think>") + 8 :]
        verdict, _ = _correct(answer_part, str(gold), require_boxed, timeout)
        scores.append(None if verdict is None else float(verdict))
    log_metric("format_rate", formatted / max(len(completions), 1))
    return scores


@reward("boxed_format", role="format")
def boxed_format(completions: list[str]) -> list[float]:
    """1.0 when the completion puts exactly one final answer in \\boxed{...}, else 0.0."""
    return [1.0 if text.count("\\boxed{") == 1 and re.search(r"\\boxed\{[^{}]+\}", text) else 0.0
            for text in completions]
