"""Contract checker: run one reward, raw, on dataset rows with good, bad, malformed and fuzz completions.

The reward is called directly, not through CompiledReward, because CompiledReward turns exceptions into None by
design, which would hide exactly what this looks for. A contract violation is: raising, returning something other
than a list with one float-or-None per completion, or an infinite score. NaN is reported as None, as the trainer
treats it.

Without a dataset, rows come from the reward's `check_rows(n) -> list[dict]` attribute when it has one, else from
the JSON extraction data or reasoning-gym arithmetic, whichever has the reward's columns. Good and bad completions
come from the reward's `check_examples(row, params) -> {"good": [...], "bad": [...]}` attribute when it has one,
else from the row: the reference program for a `canonical_solution` column, the gold JSON for a `gold` column,
`\\boxed{answer}` for an `answer` column, a generic think-then-box answer otherwise. `completion_ids` are the UTF-8 bytes of the text (one
token per byte, at most MAX_IDS), since no tokenizer is loaded here.
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

from .registry import RewardDef
from .tasks.json_tasks import build_rows

KINDS = ("good", "bad", "malformed", "fuzz")
MAX_IDS = 32_768  # token ids stop at max_completion_length in training, however long the fuzz text is

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


def _wrong_answer(answer: str) -> str:
    try:
        value = float(answer.replace(",", ""))
    except ValueError:
        return "none of the above"
    return str(int(value) + 1) if value.is_integer() else str(value + 1)


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
    wrong = _wrong_answer(answer)
    return {
        "good": [f"<think>\nLet me work it out step by step.\n</think>\nThe answer is \\boxed{{{answer}}}.",
                 f"<think>\nShort check.\n</think>\n\\boxed{{{answer}}}"],
        "bad": [f"<think>\nLet me work it out step by step.\n</think>\nThe answer is \\boxed{{{wrong}}}.",
                f"The answer is {wrong}"],
    }


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
        lines += [f"EXCEPTION {e}" for e in self.exceptions] + [f"VIOLATION {v}" for v in self.violations]
        lines.append("contract: OK" if self.ok else "contract: BROKEN")
        return "\n".join(lines)


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


def _short(text: str) -> str:
    return repr(text[:60]) + (f"... ({len(text)} chars)" if len(text) > 60 else "")


class _Call:
    """One raw call of the reward, with the context names the trainer would pass."""

    def __init__(self, rdef: RewardDef, params: dict, report: CheckReport):
        self.rdef, self.params, self.report = rdef, params, report

    def __call__(self, texts: list[str], row: dict) -> Any:
        columns = {c: [row[c]] * len(texts) for c in self.rdef.columns}
        prompt = row.get("prompt", row.get("question", ""))
        context = {
            "prompts": [prompt] * len(texts),
            "completion_ids": [list(t.encode("utf-8", "surrogatepass")[:MAX_IDS]) for t in texts],
            "log_metric": lambda name, value: self.report.metrics[name].append(float(value)),
            "log_extra": lambda name, values: None,
            "trainer_state": None,
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
) -> CheckReport:
    """Run the reward on every row with its good, bad and malformed completions (and the fuzz set on the first row).

    `examples(row, params)` overrides the reward's own check_examples and the defaults.
    """
    params = {**rdef.params, **(params or {})}
    report = CheckReport(rdef.name, rdef.source, params, rows=len(rows))
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
        for (kind, _), score in zip(batch, out, strict=True):
            report.scores[kind].append(None if score is None or math.isnan(score) else float(score))
    return report


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
