"""Code rewards: run the completion's Python code against the row's unit tests in the local sandbox.

The code is the completion's fenced ```python block (`code_block`: last, first, or all joined). Every completion
of a batch runs in parallel through `grpo_recipes.sandbox.run_many`. A sandbox failure (`infra_error`) scores
None, never 0: it says nothing about the completion. The host judges each test's assertions on the values the
program's calls return. A test it cannot split is refused by default (`sandbox_mode_tests: refuse`: it counts as
failed, logged as `refused`), since a program can forge a verdict reached in the sandbox; with `run` it runs
whole in the sandbox, logged as `judged_in_sandbox`. See docs/sandbox.md for what the sandbox guarantees.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from typing import Literal

from grpo_recipes.rewards import reward
from grpo_recipes.sandbox import STATUSES, Job, SandboxResult, run_many

MAX_CODE_CHARS = 100_000  # longer "code" is not an answer to a unit-tested task; don't ship it to a sandbox
_PYTHON_TAGS = ("python", "py", "python3")


def _fenced_blocks(text: str) -> tuple[list[str], list[str]]:
    """(python-tagged blocks, untagged blocks). A line scan, not a regex: completions can be huge or odd."""
    tagged, untagged = [], []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opener = lines[i].strip()
        if not opener.startswith("```"):
            i += 1
            continue
        tag = opener[3:].strip().lower()
        body, i = [], i + 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i])
            i += 1
        i += 1  # past the closing fence (an unclosed block runs to the end: a truncated answer is still code)
        if tag in _PYTHON_TAGS:
            tagged.append("\n".join(body))
        elif not tag:
            untagged.append("\n".join(body))
    return tagged, untagged


def extract_code(text: object, code_block: str = "last", whole_text_fallback: bool = False) -> str | None:
    """The code to run, or None when the completion has none. Never raises on a malformed completion."""
    if code_block not in ("last", "first", "all"):
        raise ValueError(f"code_block must be 'last', 'first' or 'all', got {code_block!r}")
    if not isinstance(text, str):
        return None
    tagged, untagged = _fenced_blocks(text)
    blocks = [b for b in (tagged or untagged) if b.strip()]
    if blocks:
        code = blocks[-1] if code_block == "last" else blocks[0] if code_block == "first" else "\n\n".join(blocks)
    elif whole_text_fallback and "```" not in text:
        code = text
    else:
        return None
    return code if code.strip() and len(code) <= MAX_CODE_CHARS else None


def _as_list(value: object) -> list | None:
    """A dataset column value as a list: lists pass, JSON strings are parsed, anything else is unusable."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if isinstance(value, (list, tuple)) and value:
        return list(value)
    return None


def _score(
    completions: list[str],
    make_job: Callable[[str, object], Job | None],
    rows: list,
    log_metric: Callable[[str, float], None] | None,
    score: Callable[[SandboxResult], float],
    code_block: str,
    whole_text_fallback: bool,
    max_workers: int,
) -> list[float | None]:
    scores: list[float | None] = [None] * len(completions)
    jobs, where = [], []
    counts = Counter()
    for i, (text, row) in enumerate(zip(completions, rows, strict=True)):
        code = extract_code(text, code_block, whole_text_fallback)
        job = make_job(code, row) if code is not None else None
        if code is None:
            counts["no_code"] += 1
            scores[i] = 0.0
        elif job is None:
            counts["bad_row"] += 1  # the dataset row has no usable tests: unscorable, not wrong
        else:
            jobs.append(job)
            where.append(i)
    tests_run = tests_in_sandbox = tests_refused = 0
    for i, result in zip(where, run_many(jobs, max_workers=max_workers or None)):
        counts[result.status] += 1
        scores[i] = None if result.status == "infra_error" else score(result)
        tests_run += len(result.modes)
        tests_in_sandbox += result.judged_in_sandbox
        tests_refused += result.refused
    if log_metric is not None:
        for status in (*STATUSES, "no_code", "bad_row"):
            log_metric(f"status/{status}", counts[status])
        scored = [s for s in scores if s is not None]
        log_metric("pass_rate", sum(scored) / len(scored) if scored else 0.0)
        # The share of tests the host could not judge (they ran whole in the sandbox, where a program written
        # against the harness can forge a pass): watch it when a pass rate looks too good. docs/sandbox.md.
        log_metric("judged_in_sandbox", tests_in_sandbox / tests_run if tests_run else 0.0)
        # Refused (sandbox_mode_tests: refuse): the tests the host could not split, counted as failed.
        log_metric("refused", tests_refused / tests_run if tests_run else 0.0)
    return scores


def _tests_job(timeout_s: float, memory_mb: int, sandbox_mode_tests: str):
    def make(code: str, tests: object) -> Job | None:
        tests = _as_list(tests)
        if tests is None or not all(isinstance(t, str) for t in tests):
            return None
        return Job(code, tuple(tests), timeout_s=timeout_s, memory_mb=memory_mb,
                   sandbox_mode_tests=sandbox_mode_tests)

    return make


def _io_job(timeout_s: float, memory_mb: int):
    def make(code: str, cases: object) -> Job | None:
        cases = _as_list(cases)
        if cases is None or not all(isinstance(c, (list, tuple)) and len(c) == 2 for c in cases):
            return None
        return Job(code, io_cases=tuple((str(i), str(o)) for i, o in cases), timeout_s=timeout_s, memory_mb=memory_mb)

    return make


@reward("unit_tests")
def unit_tests(
    completions: list[str],
    tests: list,
    log_metric,
    *,
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    code_block: str = "last",
    whole_text_fallback: bool = False,
    max_workers: int = 0,
    sandbox_mode_tests: Literal["refuse", "run"] = "refuse",
) -> list[float | None]:
    """Fraction of the row's `tests` (assert snippets) that pass against the completion's ```python code."""
    return _score(completions, _tests_job(timeout_s, memory_mb, sandbox_mode_tests), tests, log_metric,
                  lambda r: r.fraction,
                  code_block, whole_text_fallback, max_workers)


@reward("unit_tests_binary")
def unit_tests_binary(
    completions: list[str],
    tests: list,
    log_metric,
    *,
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    code_block: str = "last",
    whole_text_fallback: bool = False,
    max_workers: int = 0,
    sandbox_mode_tests: Literal["refuse", "run"] = "refuse",
) -> list[float | None]:
    """1.0 only when every one of the row's `tests` passes against the completion's ```python code, else 0.0."""
    return _score(completions, _tests_job(timeout_s, memory_mb, sandbox_mode_tests), tests, log_metric,
                  lambda r: 1.0 if r.status == "ok" else 0.0, code_block, whole_text_fallback, max_workers)


@reward("io_tests")
def io_tests(
    completions: list[str],
    io_cases: list,
    log_metric,
    *,
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    code_block: str = "last",
    whole_text_fallback: bool = False,
    max_workers: int = 0,
) -> list[float | None]:
    """Fraction of the row's `io_cases` ([stdin, expected stdout]) the completion's program answers exactly."""
    return _score(completions, _io_job(timeout_s, memory_mb), io_cases, log_metric, lambda r: r.fraction,
                  code_block, whole_text_fallback, max_workers)
