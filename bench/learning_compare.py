"""Compare learning runs by their held-out answers (each run's eval_completions.jsonl), paired question by question.

    python bench/learning_compare.py OUT_A OUT_B ...      # output folders, or eval_completions.jsonl files

Per run: greedy accuracy at the first and last evaluation, the paired gain with its standard error, questions fixed
and broken, accuracy on negative and non-negative golds; then the same gain under a check stricter than the reward,
"working": the answer is right AND the working's last `= X` before it says the same number (a completion with no `=`
passes; rewards/math.py's check_working). `(-7) + (-8) = 15. \\boxed{-15}` is right by the strict check and wrong
here. Both checks rescore each completion with math_correctness (answer_form literal), so runs whose own reward read
the working are compared on the same footing. Then each pair of runs' difference at the end, paired (same questions).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
from pathlib import Path

from grpo_recipes.rewards.registry import available

_MATH = available()["math_correctness"].func


def load(path: str) -> dict[str, dict]:
    p = Path(path)
    p = p / "eval_completions.jsonl" if p.is_dir() else p
    return {row["question"]: row for row in map(json.loads, p.read_text().splitlines())}


def _verdict(row: dict, when: str, check_working: bool) -> float:
    [score] = _MATH([row[when]["completion"]], [str(row["answer"])], lambda *a: None, answer_form="literal",
                    check_working=check_working)
    return float(score or 0.0)


def correct(row: dict, when: str) -> float:
    return _verdict(row, when, check_working=False)


def working_right(row: dict, when: str) -> float:
    return _verdict(row, when, check_working=True)


def paired(diffs: list[float]) -> tuple[float, float]:
    n = len(diffs)
    mean = sum(diffs) / n
    return mean, math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1) / n)


def summary(name: str, rows: dict[str, dict]) -> str:
    qs = sorted(rows)
    start, end = [correct(rows[q], "start") for q in qs], [correct(rows[q], "end") for q in qs]
    gain, se = paired([b - a for a, b in zip(start, end)])
    fixed, broken = sum(b > a for a, b in zip(start, end)), sum(b < a for a, b in zip(start, end))
    neg = [q for q in qs if str(rows[q]["answer"]).strip().startswith("-")]
    pos = [q for q in qs if q not in set(neg)]

    def acc(sub, when):
        return sum(correct(rows[q], when) for q in sub) / max(len(sub), 1)

    ws, we = [working_right(rows[q], "start") for q in qs], [working_right(rows[q], "end") for q in qs]
    wgain, wse = paired([b - a for a, b in zip(ws, we)])
    return (f"{name}: {sum(start) / len(qs):.3f} -> {sum(end) / len(qs):.3f}, gain {gain:+.3f} +- {se:.3f} "
            f"({fixed} fixed / {broken} broken; negative {acc(neg, 'start'):.2f} -> {acc(neg, 'end'):.2f}, "
            f"non-negative {acc(pos, 'start'):.2f} -> {acc(pos, 'end'):.2f}); working {sum(ws) / len(qs):.3f} -> "
            f"{sum(we) / len(qs):.3f}, gain {wgain:+.3f} +- {wse:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+")
    runs = {name: load(name) for name in ap.parse_args().runs}
    for name, rows in runs.items():
        print(summary(name, rows))
    for a, b in itertools.combinations(runs, 2):
        qs = sorted(set(runs[a]) & set(runs[b]))
        diff, se = paired([correct(runs[a][q], "end") - correct(runs[b][q], "end") for q in qs])
        print(f"  end, {a} - {b}: {diff:+.3f} +- {se:.3f} ({len(qs)} questions)")


if __name__ == "__main__":
    main()
