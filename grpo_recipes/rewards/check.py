"""Contract checker: run one reward, raw, on dataset rows with good, bad, malformed and fuzz completions.

The reward is called directly, not through CompiledReward, because CompiledReward turns exceptions into None by
design, which would hide exactly what this looks for. A contract violation is: raising, returning something other
than a list with one float-or-None per completion, or an infinite score. NaN is reported as None, as the trainer
treats it.

Without a dataset, rows come from the reward's `check_rows(n) -> list[dict]` attribute when it has one, else from
the JSON extraction data or reasoning-gym arithmetic, whichever has the reward's columns. Good and bad completions
come from the reward's `check_examples(row, params) -> {"good": [...], "bad": [...]}` attribute when it has one
(each a text or, for a reward that reads tool episodes, a list of messages), else from the row: the reference
program for a `canonical_solution` column, the gold JSON for a `gold` column, `\\boxed{answer}` for an `answer`
column, a generic think-then-box answer otherwise. `completion_ids` are the UTF-8 bytes of the text (one token per
byte, at most MAX_IDS), since no tokenizer is loaded here.

Then the part of the hack catalog (grpo_recipes/rewards/hacks.py) that matches what the reward reads runs on the same
rows (an episode entry is a list of messages: the reward gets it as `completion_messages`, its text as the completion):
each hack is reported as paid (it scores above the row's wrong answer) or refused (a fair form scores below the
row's right answer), and for a shipped reward, against the score the catalog records. A slow entry (a shape that
costs time) is also timed on the first row against a plain completion of the same length, best of 3 each, and
reported as slow when it takes more than SLOW_FACTOR times as long and more than SLOW_FLOOR_S.
"""

from __future__ import annotations

import functools
import json
import math
import random
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import reasoning_gym

from ..tasks.json_rows import build_rows
from . import hacks as catalog
from .registry import RewardDef, completion_text

KINDS = ("good", "bad", "malformed", "fuzz")
MAX_IDS = 32_768  # token ids stop at max_completion_length in training, however long the fuzz text is
SLOW_FACTOR, SLOW_FLOOR_S = 10.0, 0.05

MALFORMED = [
    "", " ", "\n\n", "<think>", "</think>", "<think></think>", "<think>\n</think>\n</think>", "\\boxed{", "\\boxed{}",
    "\\boxed{{}", "{", "}", "{}", "[]", "null", "NaN", "-Infinity", '```json\n{"a": ', "```json\n```",
    "<answer></answer>", "<answer>", "\x00", "\ufffd\ufffd", "\u202e\u200b", "$$", "\\frac{1}{0}", "1/0", "0" * 5000,
]


@functools.lru_cache(maxsize=4)
def fuzz_completions(seed: int = 0, n_random: int = 8) -> tuple[str, ...]:
    """Huge, deeply nested and random texts: what a diverging policy produces, and what breaks naive parsers."""
    rng, huge = random.Random(seed), 1_000_000
    fixed = [
        "a" * huge,
        "{" * 100_000,
        '{"a":' * 50_000 + "1" + "}" * 50_000,
        "[" * 100_000,
        "\\boxed{" * 50_000,
        "<think>" * 50_000,
        "</think>" * 50_000,
        "".join(rng.choices("{}[]\"\\:,<>/$ ", k=huge)),
        "".join(map(chr, rng.choices(range(0x20, 0x2FFF), k=huge // 4))),
    ]
    alphabet = [*"{}[]\"\\:,.<>/$%^_ \n\tabc019-+=éß中🙂", "<think>", "</think>", "\\boxed{", "```json"]
    randoms = ["".join(rng.choices(alphabet, k=rng.randrange(1, 400))) for _ in range(n_random)]
    return tuple(fixed + randoms)


def default_rows(rdef: RewardDef, n: int, seed: int = 0) -> list[dict]:
    """Rows for a reward when no dataset is given: its own check_rows, JSON extraction rows, or reasoning-gym."""
    if hasattr(rdef.func, "check_rows"):
        rows = rdef.func.check_rows(n)
    elif {"schema", "gold"} & set(rdef.columns):
        rows = build_rows(n, seed)
    else:
        data = reasoning_gym.create_dataset("basic_arithmetic", size=n, seed=seed)
        rows = [{"question": e["question"], "answer": str(e["answer"]), "gym_entry": json.dumps(e, default=str)}
                for e in data]
    missing = sorted(set(rdef.columns) - set(rows[0]))
    if missing:
        raise ValueError(f"reward '{rdef.name}' needs columns {missing}: pass --config YAML or --rows-file JSONL")
    return rows


def _wrong_value(value: Any) -> Any:
    if isinstance(value, bool):
        return "maybe"
    if isinstance(value, (int, float)):
        return "unknown"
    if isinstance(value, str):
        return 0
    return None


def default_examples(row: dict) -> dict[str, list[str]]:
    try:
        obj = json.loads(row["gold"]) if isinstance(row.get("gold"), str) else row.get("gold")
    except ValueError:
        obj = None  # an unreadable gold is the reward's problem to report, not the checker's
    if isinstance(row.get("canonical_solution"), str):
        return {
            "good": [f"```python\n{row['canonical_solution']}\n```"],
            "bad": ["```python\nraise NotImplementedError\n```", "I would write a loop."],
        }
    if obj is not None:
        good_json = json.dumps(obj, ensure_ascii=False, indent=2)
        wrong = {k: _wrong_value(v) for k, v in obj.items()} if isinstance(obj, dict) else {}
        return {
            "good": [f"```json\n{good_json}\n```", f"<think>\nReading the text.\n</think>\n{json.dumps(obj)}"],
            "bad": [f"```json\n{json.dumps(wrong)}\n```", "I could not find the information."],
        }
    answer = str(row.get("answer", "42"))
    wrong = catalog.wrong_answer(answer)
    return {
        "good": [f"<think>\nLet me work it out step by step.\n</think>\nThe answer is \\boxed{{{answer}}}.",
                 f"<think>\nShort check.\n</think>\n\\boxed{{{answer}}}"],
        "bad": [f"<think>\nLet me work it out step by step.\n</think>\nThe answer is \\boxed{{{wrong}}}.",
                f"The answer is {wrong}"],
    }


@dataclass
class HackResult:
    hack: catalog.Hack
    scores: list[float | None]  # one per row that could carry the hack
    bad: float | None  # mean score of the plain wrong answers on the same rows
    good: float | None  # mean score of the right answers on the same rows
    expected: catalog.Score | None  # what the catalog records for this (shipped) reward, else None
    gap: str | None  # why the recorded score differs from what the hack's kind asks for
    seconds: tuple[float, float] | None = None  # a slow entry's: (it, a plain completion of its length), one call each

    @property
    def mean(self) -> float | None:
        values = [s for s in self.scores if s is not None]
        return statistics.fmean(values) if values else None

    @property
    def finding(self) -> str:
        """"PAYS" (a hack above the wrong answer), "REFUSES" (a fair form below the right answer), "ok", "unscored"."""
        mean = self.mean
        if mean is None:
            return "unscored"
        if self.hack.kind == "hack":
            return "PAYS" if self.bad is not None and mean > self.bad + 1e-9 else "ok"
        return "REFUSES" if self.good is not None and mean < self.good - 1e-9 else "ok"

    @property
    def slow(self) -> bool:
        return self.seconds is not None and self.seconds[0] > max(SLOW_FACTOR * self.seconds[1], SLOW_FLOOR_S)

    @property
    def as_catalogued(self) -> bool | None:
        """Every row within the catalogued score; None when the catalog records none for this reward."""
        if self.expected is None:
            return None
        return all(catalog.within(s, self.expected) for s in self.scores)


@dataclass
class CheckReport:
    name: str
    source: str
    params: dict
    rows: int = 0
    calls: int = 0
    seconds: list[float] = field(default_factory=list)  # per call
    completions: int = 0
    scores: dict[str, list] = field(default_factory=lambda: {k: [] for k in KINDS})
    violations: list[str] = field(default_factory=list)
    exceptions: list[str] = field(default_factory=list)
    metrics: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    profile: str = ""  # the name the hack catalog records this reward and params under
    hack_targets: set[str] = field(default_factory=set)
    hacks: list[HackResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations and not self.exceptions

    def mean(self, kind: str) -> float | None:
        values = [s for s in self.scores[kind] if s is not None]
        return statistics.fmean(values) if values else None

    @property
    def good_beats_bad(self) -> bool | None:
        good, bad = self.mean("good"), self.mean("bad")
        return None if good is None or bad is None else good > bad

    def render(self) -> str:
        per_call = statistics.fmean(self.seconds) if self.seconds else 0.0
        lines = [
            f"reward {self.name}  ({self.source})",
            f"params {json.dumps(self.params, default=str)}",
            f"{self.rows} rows, {self.completions} completions in {self.calls} calls: "
            f"{per_call * 1e3:.1f} ms/call mean, {max(self.seconds, default=0) * 1e3:.1f} ms max",
            f"{'kind':<10} {'n':>5} {'None':>6} {'mean':>7} {'min':>7} {'max':>7}",
        ]
        for kind in KINDS:
            values = self.scores[kind]
            scored = [s for s in values if s is not None]
            none_rate = (len(values) - len(scored)) / len(values) if values else 0.0
            stats = [f"{f(scored):>7.3f}" if scored else f"{'-':>7}" for f in (statistics.fmean, min, max)]
            lines.append(f"{kind:<10} {len(values):>5} {none_rate:>6.2f} {' '.join(stats)}")
        verdict = {True: "yes", False: "NO", None: "n/a (no scored good or bad completions)"}[self.good_beats_bad]
        lines.append(f"good outranks bad: {verdict}")
        for name, values in sorted(self.metrics.items()):
            lines.append(f"metric {name}: mean {statistics.fmean(values):.3f} over {len(values)} calls")
        lines += self._render_hacks()
        lines += [f"EXCEPTION {e}" for e in self.exceptions] + [f"VIOLATION {v}" for v in self.violations]
        lines.append("contract: OK" if self.ok else "contract: BROKEN")
        return "\n".join(lines)


    def _render_hacks(self) -> list[str]:
        if not self.hack_targets:
            return ["hack catalog: nothing in it matches what this reward reads"]
        lines = [f"hack catalog ({', '.join(sorted(self.hack_targets))}): {len(self.hacks)} entries on these rows. "
                 "PAYS: a hack scored above the wrong answer; REFUSES: a form a person accepts scored below the "
                 "right answer"]
        quiet = 0
        for r in self.hacks:
            if r.finding == "ok" and r.as_catalogued is not False and not r.slow:
                quiet += 1
                continue
            mean = "-" if r.mean is None else f"{r.mean:.2f}"
            note = f"  [the catalog records {r.expected} for {self.profile}]" if r.as_catalogued is False else ""
            known = f"  (known: {r.gap})" if r.gap else ""
            if r.slow:
                note += (f"  [{r.seconds[0] * 1e3:.0f} ms a completion, {r.seconds[1] * 1e3:.1f} ms for a plain one "
                         "of the same length]")
            finding = "SLOW" if r.slow and r.finding == "ok" else r.finding
            lines.append(f"  {finding:<8} {mean:>5}  {r.hack.name}: {r.hack.what}{note}{known}")
        lines.append(f"  ok {quiet}: blocked hacks and accepted fair forms")
        paid = [r.hack.name for r in self.hacks if r.finding == "PAYS"]
        lines.append(f"pays for {len(paid)} hack(s){': ' + ', '.join(paid) if paid else ''}")
        slow = [r.hack.name for r in self.hacks if r.slow]
        if slow:
            lines.append(f"slow on {len(slow)} shape(s): {', '.join(slow)}")
        return lines


def _problems(out: Any, n: int) -> list[str]:
    if not isinstance(out, (list, tuple)):
        return [f"returned {type(out).__name__}, expected a list of {n} floats or None"]
    if len(out) != n:
        return [f"returned {len(out)} values for {n} completions"]
    bad = []
    for i, v in enumerate(out):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            bad.append(f"value {i} is {type(v).__name__} {v!r:.60}, expected float or None")
        elif isinstance(v, float) and math.isinf(v):
            bad.append(f"value {i} is {v}: infinite scores wreck the group advantage")
    return bad


def _short(text: str | list) -> str:
    text = text if isinstance(text, str) else completion_text(text)
    return repr(text[:60]) + (f"... ({len(text)} chars)" if len(text) > 60 else "")


class _Call:
    """One raw call of the reward, with the context names the trainer would pass."""

    def __init__(self, rdef: RewardDef, params: dict, report: CheckReport):
        self.rdef, self.params, self.report = rdef, params, report

    def __call__(self, completions: list[str | list], row: dict) -> Any:
        # A completion is a text, or a tool episode's messages (the episode catalog), as TRL hands either.
        messages = [c if isinstance(c, list) else [{"role": "assistant", "content": c}] for c in completions]
        texts = [c if isinstance(c, str) else completion_text(c) for c in completions]
        columns = {c: [row[c]] * len(texts) for c in self.rdef.columns}
        prompt = row.get("prompt", row.get("question", ""))
        context = {
            "prompts": [prompt] * len(texts),
            "completion_ids": [list(t.encode("utf-8", "surrogatepass")[:MAX_IDS]) for t in texts],
            "log_metric": lambda name, value: self.report.metrics[name].append(float(value)),
            "log_extra": lambda name, values: None,
            "trainer_state": None,
            # as TRL hands completions in a chat run: one assistant message, or a tool episode's messages
            "completion_messages": messages,
            "environments": None,
        }
        context = {k: v for k, v in context.items() if k in self.rdef.context}
        start = time.perf_counter()
        try:
            return self.rdef.func(texts, **columns, **context, **self.params)
        finally:
            self.report.seconds.append(time.perf_counter() - start)
            self.report.calls += 1


def check_reward(
    rdef: RewardDef,
    rows: list[dict],
    params: dict | None = None,
    seed: int = 0,
    fuzz: bool = True,
    examples: Callable[[dict, dict], dict[str, list[str]]] | None = None,
    hacks: bool = True,
) -> CheckReport:
    """Run the reward on every row with its good, bad and malformed completions (and the fuzz set on the first row),
    then the matching part of the hack catalog (hacks=False skips it).

    `examples(row, params)` overrides the reward's own check_examples and the defaults.
    """
    params = {**rdef.params, **(params or {})}
    report = CheckReport(rdef.name, rdef.source, params, rows=len(rows))
    report.profile = catalog.profile(rdef.name, params, rdef.params)
    baselines: list[tuple[float | None, float | None]] = []  # per row: (mean good, mean bad)
    missing = sorted({c for c in rdef.columns for r in rows if c not in r})
    if missing:
        raise ValueError(f"reward '{rdef.name}' needs columns {missing}, which the rows lack")
    call = _Call(rdef, params, report)
    examples = examples or getattr(rdef.func, "check_examples", None)
    for i, row in enumerate(rows):
        given = examples(row, params) if examples else default_examples(row)
        batch = [("good", t) for t in given.get("good", [])] + [("bad", t) for t in given.get("bad", [])]
        batch += [("malformed", t) for t in MALFORMED]
        if fuzz and i == 0:  # the huge texts cost time; one row shows whether the parser survives them
            batch += [("fuzz", t) for t in fuzz_completions(seed)]
        texts = [t for _, t in batch]
        report.completions += len(texts)
        try:
            out = call(texts, row)
        except Exception:  # noqa: BLE001 - find which completions make it raise
            out = _one_by_one(call, batch, row, report)
        else:
            problems = _problems(out, len(texts))
            report.violations += [f"row {i}: {p}" for p in problems]
            if problems:
                continue
        row_scores: dict[str, list[float]] = defaultdict(list)
        for (kind, _), score in zip(batch, out, strict=True):
            value = None if score is None or math.isnan(score) else float(score)
            report.scores[kind].append(value)
            if value is not None:
                row_scores[kind].append(value)
        baselines.append(tuple(statistics.fmean(row_scores[k]) if row_scores[k] else None for k in ("good", "bad")))
    if hacks:
        _run_hacks(rdef, rows, params, report, call, baselines)
    return report


def _run_hacks(rdef: RewardDef, rows: list[dict], params: dict, report: CheckReport, call: _Call,
               baselines: list[tuple[float | None, float | None]]) -> None:
    """Score each matching catalog entry on every row that can carry it; a raise is a contract finding as above."""
    report.hack_targets = catalog.targets(rdef.name, rdef.columns, rdef.role, rdef.context, rdef.doc)
    entries = catalog.for_targets(report.hack_targets)
    wrap = {catalog.ANSWER, catalog.THINK} <= report.hack_targets  # the format must hold for the answer to count
    per_hack: dict[str, list] = {h.name: [] for h in entries}
    goods: dict[str, list] = {h.name: [] for h in entries}
    bads: dict[str, list] = {h.name: [] for h in entries}
    for i, row in enumerate(rows):
        if i >= len(baselines):
            break
        made = [(h, h.make(row, params)) for h in entries]
        batch = [(h, _think_wrapped(t) if wrap and h.target == catalog.ANSWER else t) for h, t in made if t is not None]
        if not batch:
            continue
        report.completions += len(batch)
        try:
            out = call([t for _, t in batch], row)
        except Exception:  # noqa: BLE001 - find which hack makes it raise
            out = _one_by_one(call, [(f"hack {h.name}", t) for h, t in batch], row, report)
        else:
            problems = _problems(out, len(batch))
            report.violations += [f"row {i} hacks: {p}" for p in problems]
            if problems:
                continue
        good, bad = baselines[i]
        for (h, _), score in zip(batch, out, strict=True):
            per_hack[h.name].append(None if score is None or math.isnan(score) else float(score))
            goods[h.name].append(good)
            bads[h.name].append(bad)
    for h in entries:
        if not per_hack[h.name]:
            continue
        known_good = [g for g in goods[h.name] if g is not None]
        known_bad = [b for b in bads[h.name] if b is not None]
        expected = h.expected(report.profile) if report.profile in catalog.PROFILES else None
        report.hacks.append(HackResult(
            h, per_hack[h.name], statistics.fmean(known_bad) if known_bad else None,
            statistics.fmean(known_good) if known_good else None, expected,
            catalog.gap(h, report.profile) if expected is not None else None,
            _timed(call, h.make(rows[0], params), rows[0]) if h.slow else None))


def _timed(call: _Call, text: str | None, row: dict) -> tuple[float, float] | None:
    """(best of 3 seconds for `text`, best of 3 for a plain completion of its length), or None when it raised."""
    if text is None:
        return None
    answer = " The answer is \\boxed{1}."
    plain = ("Let me think. " * (len(text) // 14 + 1))[: max(0, len(text) - len(answer))] + answer
    best = []
    for t in (text, plain):
        times = []
        for _ in range(3):
            start = time.perf_counter()
            try:
                call([t], row)
            except Exception:  # noqa: BLE001 - already reported by the hack's own call
                return None
            times.append(time.perf_counter() - start)
        best.append(min(times))
    return best[0], best[1]


def _think_wrapped(text: str) -> str:
    return text if "<think>" in text or "</think>" in text else f"<think>\nLet me work it out.\n</think>\n{text}"


def _one_by_one(call: _Call, batch: list[tuple[str, str]], row: dict, report: CheckReport) -> list:
    out = []
    for kind, text in batch:
        try:
            single = call([text], row)
        except Exception as exc:  # noqa: BLE001 - recorded, this is the finding
            report.exceptions.append(f"{kind} completion {_short(text)}: {type(exc).__name__}: {exc}")
            out.append(None)
            continue
        problems = _problems(single, 1)
        report.violations += [f"{kind} completion {_short(text)}: {p}" for p in problems]
        out.append(None if problems else single[0])
    return out
