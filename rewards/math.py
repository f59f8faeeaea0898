"""Math rewards: answer correctness, and the think-tag and box formats.

Where the answer is read, and what a number literal is: grpo_recipes/answers.py (shared with rewards/exact.py) and
docs/rewards.md. `answer_form: literal` decides without sympy. `answer_form: expression` asks math-verify, in a child
process (rewards/_math_worker.py) that is killed when an answer overruns `timeout_s`, so the deadline holds in any
thread or process: math-verify's own SIGALRM timeouts work only on the main thread, and not inside a long C call.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import select
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Annotated, Literal, get_args

from grpo_recipes.rewards import Range, answers, reward

AnswerForm = Literal["literal", "expression"]  # the annotation is the start-up check (registry)
ANSWER_FORMS = get_args(AnswerForm)
_WORKER = Path(__file__).with_name("_math_worker.py")
_STARTUP_S = 120.0  # importing sympy on a loaded machine; a worker that is not ready by then is broken
_GRACE_S = 1.0  # past timeout_s, so that math-verify's own timeout can answer before the process is killed
_MAX_EXPRESSION = 1000  # characters: no answer is longer, and sympy's cost grows with length
_DIGIT = re.compile(r"\d")

# Answers sympy would evaluate for minutes, refused before it sees them (the deadline catches the rest): a numeric
# exponent with its own exponent (9^{9^{9^9}}), and exponents or factorials of five or more digits.
# Each alternative starts at a "^" or at the first digit of a run, so a 20,000-character region is scanned linearly.
_COSTLY = re.compile(r"\^\s*\{[\d\s{}()+*\-]*\^|\^\s*\{?\s*\d{5,}|(?<!\d)\d{5,}\s*!")


class _Verifier:
    """One math-verify process per trainer process, replaced when an answer overruns its deadline.

    Thread-safe (one request at a time); a forked child starts its own instead of sharing the parent's pipes.
    """

    def __init__(self):
        self._forget()

    def _forget(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._ready = False
        self._buffer = b""

    def ask(self, mode: str, answer: str, gold: str, timeout_s: float) -> str:
        """"1", "0", "N" (gold unparseable) or "T" (killed at the deadline: the answer is scored 0)."""
        request = (json.dumps([mode, answer, gold, timeout_s]) + "\n").encode()  # ASCII: lone surrogates survive
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._start()
            if not self._ready:
                self._wait_ready()
            try:
                self._proc.stdin.write(request)
                self._proc.stdin.flush()
            except OSError:  # it died between requests (OOM killer, CPU limit): a fresh one answers the next
                self._restart()
                return "T"
            reply = self._read_line(time.monotonic() + timeout_s + _GRACE_S)
            if reply is None:
                self._restart()
                return "T"
            return reply

    def _start(self) -> None:
        if not sys.executable:
            raise RuntimeError("answer_form 'expression' runs math-verify in a child process, which needs "
                               "sys.executable; this interpreter has none")
        env = {**os.environ, "GRPO_RECIPES_SYS_PATH": json.dumps(sys.path)}
        self._stderr = tempfile.TemporaryFile()
        self._proc = subprocess.Popen([sys.executable, "-I", str(_WORKER)], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=self._stderr, env=env)
        self._ready, self._buffer = False, b""

    def _wait_ready(self) -> None:
        line = self._read_line(time.monotonic() + _STARTUP_S)
        if line != "ready":
            self._stderr.seek(0)
            tail = self._stderr.read()[-2000:].decode(errors="replace")
            self.close()
            raise RuntimeError(f"the math-verify worker ({_WORKER}) did not start within {_STARTUP_S:.0f} s: {tail}")
        self._ready = True

    def _read_line(self, deadline: float) -> str | None:
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None  # the process died
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()

    def _restart(self) -> None:
        self.close()
        self._start()  # importing sympy overlaps with whatever the trainer does before the next expression

    def close(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            for stream in (self._proc.stdin, self._proc.stdout, self._stderr):
                stream.close()
            self._proc = None


_VERIFIER = _Verifier()
atexit.register(_VERIFIER.close)
os.register_at_fork(after_in_child=_VERIFIER._forget)


def _split_top(text: str, separator: re.Pattern) -> list[str]:
    """`text` split at the separator where it is outside every brace and parenthesis."""
    parts, depth, start = [], 0, 0
    for m in re.finditer(rf"[{{}}()\[\]]|{separator.pattern}", text):
        ch = m.group()
        if ch in "{([":
            depth += 1
        elif ch in "})]":
            depth -= 1
        elif depth == 0:
            parts.append(text[start : m.start()])
            start = m.end()
    return [*parts, text[start:]]


def _final_answer(text: str, require_boxed: bool, join_boxes: bool) -> tuple[str | None, str]:
    """(answer, where): where is "box", "anchor", "text" (require_boxed=False and nothing else), "none" or "hedge"."""
    region = answers.answer_region(text)
    if region is None:
        return None, "none"
    group = answers.final_box_group(region)
    if group is not None:
        one = answers.single_answer(group) if group else None
        if one is None and len(group) > 1 and join_boxes:
            # Several final boxes are one answer when the gold has several parts ({1, -2}); math-verify compares
            # them as a set, which never equals a single value, so a hedge still scores 0.
            return ", ".join(group), "box"
        if one is None:
            return None, "hedge" if group else "none"
        return (None, "none") if answers.is_blank(one) else (one, "box")
    anchored = answers.anchored_answer(region)
    if anchored is not None:
        return anchored, "anchor"
    return (None, "none") if require_boxed else (region, "text")


def _expression_equal(answer: str, gold: str, gold_literal, words: bool, timeout_s: float) -> tuple[str, bool]:
    """(verdict, used sympy): verdict "1", "0", "N" (gold unparseable) or "T" (too costly, or cut at the deadline)."""
    pred_literal = answers.parse_literal(answer, words=words)
    if pred_literal is not None and gold_literal is not None:
        return ("1" if answers.literal_equal(pred_literal, gold_literal) else "0"), False
    if answers.negated(answer) or (_DIGIT.search(answer) and answers.qualified(answer)):
        return "0", False  # \boxed{3 \text{ is wrong}}, \boxed{3 \text{ eight}}: math-verify would read the 3
    # Plain forms as the literal path reads them (1³ is 1^{3}, not 13); a run of 800 spaces costs math-verify 0.6 s.
    answer = answers.squash_spaces(answers.normalize_text(answer))
    if len(answer) > _MAX_EXPRESSION:
        return "T", False
    answer = answers.unwrap(answers.strip_percent(answer))
    parts = _split_top(answer, answers.EQUALS)
    if len(parts) > 1 and len(_split_top(gold, answers.EQUALS)) == 1:
        # An equation answers a value only when every side equals it: x = 3 and 2 + 1 = 3, never 5 = 3.
        if answers.is_variable(parts[0]):
            parts = parts[1:]
        results = [_expression_equal(p, gold, gold_literal, words, timeout_s) for p in parts]
        return next((v for v, _ in results if v != "1"), "1"), any(used for _, used in results)
    if _COSTLY.search(answer):
        return "T", False
    return _VERIFIER.ask("box", answer, gold, timeout_s), True


def _judge(text: str, gold: str, form: str, require_boxed: bool, timeout_s: float) -> tuple[float | None, str]:
    """(score, how): how is "literal" (decided without sympy), "sympy", "none", "hedge", "costly" or "gold"."""
    gold_literal = answers.parse_literal(gold, lowest_terms=False)
    if form == "literal":
        if gold_literal is None:
            return None, "gold"
        answer, where = _final_answer(text, require_boxed, False)
        if where == "text":
            answer, where = answers.last_line(answer), "anchor"
        if answer is None:
            return 0.0, where
        pred = answers.parse_literal(answer, words=where == "anchor")
        return float(pred is not None and answers.literal_equal(pred, gold_literal)), "literal"
    # math-verify gets a literal gold as its plain value (it reads neither "+5" nor "1 000"), and no percent sign.
    gold = answers.strip_percent(gold) if gold_literal is None else answers.literal_text(gold_literal)
    answer, where = _final_answer(text, require_boxed, join_boxes=gold_literal is None)
    if answer is None:
        if gold_literal is None and _VERIFIER.ask("box", "", gold, timeout_s) == "N":
            return None, "gold"
        return 0.0, where
    if where == "text":
        costly = _COSTLY.search(answer)
        verdict, used = ("T", False) if costly else (_VERIFIER.ask("text", answer, gold, timeout_s), True)
    else:
        verdict, used = _expression_equal(answer, gold, gold_literal, where == "anchor", timeout_s)
    if verdict == "N":
        return None, "gold"
    if verdict == "T":
        return 0.0, "costly"
    return float(verdict == "1"), "sympy" if used else "literal"


def _check_params(answer_form: str, timeout_s: float) -> None:
    if answer_form not in ANSWER_FORMS:
        raise ValueError(f"answer_form must be one of {ANSWER_FORMS}, got {answer_form!r}: 'literal' for tasks whose "
                         "answer is a number (arithmetic, GSM8K), 'expression' for symbolic answers (MATH)")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")


def _unrelated(text: str, gold: str, prompt) -> bool:
    """The working computes with numbers that are not the question's (`0 + 7 = 7` for "Calculate 3 + 4."): only
    knowable when the prompt's question is an arithmetic expression worth the gold."""
    expression = answers.asked_expression(prompt, gold) if prompt is not None else None
    return expression is not None and answers.working_unrelated(text, expression)


def _score_all(texts, golds, answer_form, require_boxed, timeout_s, log_metric, skip=None,
               check_working=False, check_equations=False, prompts=None) -> list[float | None]:
    _check_params(answer_form, timeout_s)
    scores: list[float | None] = []
    hows: list[str] = []
    disagreed = unrelated = refuted = 0
    for i, (text, gold) in enumerate(zip(texts, golds, strict=True)):
        if skip is not None and skip[i]:
            scores.append(0.0)
            continue
        score, how = _judge(text, str(gold), answer_form, require_boxed, float(timeout_s))
        if check_working and score == 1.0 and answers.working_disagrees(text, str(gold)):
            score, disagreed = 0.0, disagreed + 1
        if (check_working and score == 1.0 and prompts is not None
                and _unrelated(text, str(gold), prompts[i])):
            score, unrelated = 0.0, unrelated + 1
        if check_equations and score == 1.0 and answers.false_equation(text):
            score, refuted = 0.0, refuted + 1
        scores.append(score)
        hows.append(how)
    n = max(len(texts), 1)
    for metric, kinds in (("gold_unparseable", {"gold"}), ("fast_path_rate", {"literal", "none", "hedge"}),
                          ("no_answer", {"none"}), ("hedge", {"hedge"}), ("too_costly", {"costly"})):
        log_metric(metric, sum(h in kinds for h in hows) / n)
    if check_working:
        log_metric("working_disagrees", disagreed / n)
        log_metric("working_unrelated", unrelated / n)
    if check_equations:
        log_metric("false_equation", refuted / n)
    return scores


@reward("math_correctness")
def math_correctness(
    completions: list[str],
    answer: list[str],
    log_metric,
    *,
    answer_form: AnswerForm = "literal",
    require_boxed: bool = True,
    timeout_s: Annotated[float, Range(gt=0)] = 3,
    check_working: bool = False,
    check_equations: bool = False,
    prompts: list | None = None,
) -> list[float | None]:
    """1.0 when the final answer (last box after </think>, else after "answer is") equals the gold, else 0.0; None when the gold cannot be read.

    answer_form "literal": the answer must be a number literal (42, -3.5, 1,000, 3/4 in lowest terms, x = 42, 42
    apples), compared exactly, without sympy; the gold must be a literal too. For tasks whose question is an
    expression (arithmetic), where math-verify would accept the question copied into the box. "expression": any
    expression math-verify finds equal (2+1, \\frac{6}{8}, \\sqrt3), judged in a child process killed after timeout_s.
    Both forms: a hedge (two different final boxes, \\boxed{3, 5}, "3 or 5") scores 0; an equation counts only if every
    side equals the gold (x = 3 yes, 5 = 3 no); percent signs are dropped on both sides (25% matches 25, 300% not 3);
    two decimals must be equal exactly (0.1 is not 0.1000004); a fraction matches a decimal of 6+ places it rounds to.
    Where this differs from math-verify and TRL's accuracy_reward: docs/rewards.md.

    require_boxed=False also reads an answer with no box and no anchor: the last line (literal) or math-verify's pick
    from the text (expression). Never on tasks whose question is an expression: a restated question then scores.

    check_working=True also reads the working (the reasoning inside <think> included): a right answer scores 0 when
    the last `=` before it is followed by another number (`-7 - 8 = 15. \\boxed{-15}`: the sign put in the box, not in
    the sum), and, when the prompt's question is an arithmetic expression worth the gold, when a step computes with
    numbers that are neither the question's nor an earlier result (`0 + 7 = 7. \\boxed{7}` for "Calculate 3 + 4."). A
    relation written another way (`＝`, `→`, "equals", `&=`) is read as `=` (answers.read_relations). For tasks whose
    working is one chain of equations ending in the answer (arithmetic); a completion with no `=`, or whose last `=`
    is not followed by a number, is judged on its answer alone, and so is a gold that is not a number literal;
    working written after the final box is not read.

    check_equations=True also scores a right answer 0 when any equation in the completion (inside <think> too) is
    false where its sides are plain arithmetic or numbers (`7 + 1 = 7. So 7 = 7. \\boxed{7}`, `7 + 1 = \\boxed{7}`);
    sides that are not (`x`, `\\sqrt{9}`, words) are not judged. With check_working, the default of the arithmetic
    task (tasks/arithmetic.py): together they pay only for working that holds, is about the question and ends on the
    answer."""
    return _score_all(completions, answer, answer_form, require_boxed, timeout_s, log_metric,
                      check_working=check_working, check_equations=check_equations, prompts=prompts)


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
    answer_form: AnswerForm = "literal",
    require_boxed: bool = True,
    timeout_s: Annotated[float, Range(gt=0)] = 3,
) -> list[float | None]:
    """1.0 when the think format holds and the answer after </think> is correct (as math_correctness judges it); None when the gold cannot be read."""
    unformatted = [not _think_ok(text, strict, template_opens_think) for text in completions]
    log_metric("format_rate", 1 - sum(unformatted) / max(len(completions), 1))
    # A failed format scores 0 without verification, whatever the gold.
    return _score_all(completions, answer, answer_form, require_boxed, timeout_s, log_metric, skip=unformatted)


@reward("boxed_format", role="format")
def boxed_format(completions: list[str], *, numeric: bool = False) -> list[float]:
    """1.0 when the final answer (after </think>) is one \\boxed{...} that shows something: not two differing boxes side by side, not a box left open.

    A box that shows nothing is empty: \\boxed{{}}, \\boxed{\\text{}}, \\boxed{\\phantom{0}}, a zero-width space.

    numeric=True also asks that the box hold a number literal (as math_correctness's answer_form "literal" reads it:
    -15, 3/4, \\frac{1}{2}, x = 4), so that \\boxed{B} or a box around words earns nothing. For tasks whose every
    answer is a number: a policy trained at lr 2e-5 collapsed into \\boxed{B} on every question, paid by the plain
    format reward alone (bench/results/learning_budget15.md, session 7)."""
    scores = []
    for text in completions:
        region = answers.answer_region(text)
        group = answers.final_box_group(region) if region is not None else None
        one = answers.single_answer(group) if group else None
        ok = one is not None and not answers.is_blank(one) and (not numeric or answers.parse_literal(one) is not None)
        scores.append(1.0 if ok else 0.0)
    return scores
