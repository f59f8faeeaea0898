"""Procedural code tasks with unit tests: the code recipe's training data (HumanEval, held out: humaneval.py).

Rows have `id`, `question` (the instruction), `tests` (assert snippets for the `unit_tests` rewards), `entry_point`
and `canonical_solution` (a full program that passes the tests; never shown to the model).

    python -m grpo_recipes.tasks.code_rows --n 300 --seed 0 --out recipes/data/code_train.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ANSWER_FORMAT = "Answer with a single ```python code block that defines `{name}`."


@dataclass(frozen=True)
class _Family:
    names: tuple[str, ...]
    params: str
    describe: Callable[[dict], str]
    source: str  # a reference solution; {name} and the knobs are filled in
    knobs: Callable[[random.Random], dict]
    args: Callable[[random.Random, dict], tuple]  # one random call's arguments


def _ints(rng: random.Random, lo: int = -20, hi: int = 40, max_len: int = 8) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(rng.randint(0, max_len))]


def _word(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(1, 9)))


def _sentence(rng: random.Random) -> str:
    return " ".join(_word(rng) for _ in range(rng.randint(1, 6)))


def _maybe_palindrome(rng: random.Random) -> str:
    half = "".join(rng.choice("abcXYZ12") for _ in range(rng.randint(0, 5)))
    text = half + rng.choice(["", "q", "7"]) + half[::-1] if rng.random() < 0.5 else _word(rng) + "x"
    return "".join(c.upper() if rng.random() < 0.3 else c for c in text) + rng.choice(["", "!", " ,"])


_FAMILIES = (
    _Family(("sum_multiples", "total_divisible", "add_multiples"), "nums",
            lambda k: f"returns the sum of the numbers in the list `nums` that are divisible by {k['k']}",
            "def {name}(nums):\n    return sum(x for x in nums if x % {k} == 0)\n",
            lambda rng: {"k": rng.choice([2, 3, 5, 7])}, lambda rng, k: (_ints(rng),)),
    _Family(("count_vowels", "vowel_count", "num_vowels"), "text",
            lambda k: "returns how many characters of the string `text` are vowels (a, e, i, o, u, in either case)",
            "def {name}(text):\n    return sum(1 for ch in text.lower() if ch in 'aeiou')\n",
            lambda rng: {}, lambda rng, k: ("".join(c.upper() if rng.random() < 0.3 else c for c in _sentence(rng)),)),
    _Family(("reverse_words", "flip_words", "words_backwards"), "sentence",
            lambda k: "returns `sentence` with the order of its words reversed (words are separated by single spaces)",
            "def {name}(sentence):\n    return ' '.join(sentence.split(' ')[::-1])\n",
            lambda rng: {}, lambda rng, k: (_sentence(rng),)),
    _Family(("running_totals", "prefix_sums", "cumulative"), "nums",
            lambda k: "returns the list of running " + ("totals" if k["op"] == "sum" else "maxima") +
            " of the list `nums` (element i is the " + ("sum" if k["op"] == "sum" else "maximum") +
            " of nums[0..i]; an empty list gives an empty list)",
            "def {name}(nums):\n    out = []\n    for x in nums:\n"
            "        out.append(x if not out else {step})\n    return out\n",
            lambda rng: rng.choice([{"op": "sum", "step": "out[-1] + x"}, {"op": "max", "step": "max(out[-1], x)"}]),
            lambda rng, k: (_ints(rng),)),
    _Family(("seq_term", "nth_term", "sequence_value"), "n",
            lambda k: f"returns term `n` (counting from 0) of the sequence that starts {k['a']}, {k['b']} "
                      "and where every later term is the sum of the two before it",
            "def {name}(n):\n    a, b = {a}, {b}\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
            lambda rng: {"a": rng.randint(0, 3), "b": rng.randint(1, 4)}, lambda rng, k: (rng.randint(0, 25),)),
    _Family(("is_palindrome", "reads_same_backwards", "palindromic"), "text",
            lambda k: "returns True when `text` reads the same forwards and backwards once everything but letters "
                      "and digits is removed and case is ignored, else False",
            "def {name}(text):\n    kept = [c.lower() for c in text if c.isalnum()]\n    return kept == kept[::-1]\n",
            lambda rng: {}, lambda rng, k: (_maybe_palindrome(rng),)),
    _Family(("unique_in_order", "dedupe", "drop_repeats"), "items",
            lambda k: "returns the items of the list `items` without duplicates, keeping the first occurrence of each "
                      "in the original order",
            "def {name}(items):\n    seen, out = set(), []\n    for x in items:\n        if x not in seen:\n"
            "            seen.add(x)\n            out.append(x)\n    return out\n",
            lambda rng: {}, lambda rng, k: (_ints(rng, 0, 6, 10),)),
    _Family(("second_largest", "runner_up", "next_to_max"), "nums",
            lambda k: "returns the second largest distinct value in the list `nums`, or None when it has fewer "
                      "than two distinct values",
            "def {name}(nums):\n    values = sorted(set(nums))\n    return values[-2] if len(values) > 1 else None\n",
            lambda rng: {}, lambda rng, k: (_ints(rng, -5, 9, 6),)),
    _Family(("caesar", "shift_letters", "rotate_text"), "text",
            lambda k: f"returns `text` with every lowercase letter moved {k['k']} places forward in the alphabet "
                      "(wrapping around from z to a); every other character stays as it is",
            "def {name}(text):\n    return ''.join(chr((ord(c) - 97 + {k}) % 26 + 97) if 'a' <= c <= 'z' else c "
            "for c in text)\n",
            lambda rng: {"k": rng.randint(1, 25)}, lambda rng, k: (_sentence(rng) + rng.choice(["", "!", " A1"]),)),
    _Family(("count_long_words", "long_word_count", "words_longer_than"), "sentence",
            lambda k: f"returns how many words of `sentence` (split on whitespace) are longer than {k['k']} characters",
            "def {name}(sentence):\n    return sum(1 for w in sentence.split() if len(w) > {k})\n",
            lambda rng: {"k": rng.randint(2, 6)}, lambda rng, k: (_sentence(rng),)),
    _Family(("digit_sum", "sum_of_digits", "add_digits"), "n",
            lambda k: "returns the sum of the decimal digits of the non-negative integer `n`" +
            (", repeated until a single digit remains" if k["repeat"] else ""),
            "def {name}(n):\n    while True:\n        n = sum(int(d) for d in str(n))\n"
            "        if not {repeat} or n < 10:\n            return n\n",
            lambda rng: {"repeat": rng.random() < 0.5}, lambda rng, k: (rng.randint(0, 10 ** rng.randint(1, 9)),)),
    _Family(("clamp_all", "limit_values", "clip_list"), "nums",
            lambda k: f"returns a new list where each number of `nums` is limited to the range [{k['lo']}, {k['hi']}] "
                      "(smaller numbers become the lower bound, larger ones the upper bound)",
            "def {name}(nums):\n    return [min(max(x, {lo}), {hi}) for x in nums]\n",
            lambda rng: (lambda lo: {"lo": lo, "hi": lo + rng.randint(0, 15)})(rng.randint(-10, 10)),
            lambda rng, k: (_ints(rng),)),
)


def _call(name: str, args: tuple) -> str:
    return f"{name}({', '.join(repr(a) for a in args)})"


def _task(rng: random.Random) -> dict:
    fam = rng.choice(_FAMILIES)
    name, knobs = rng.choice(fam.names), fam.knobs(rng)
    solution = fam.source.format(name=name, **knobs)
    namespace: dict = {}
    exec(solution, namespace)  # our own reference code, to compute the expected values
    func = namespace[name]
    calls: list[tuple] = []
    for _ in range(50):  # distinct inputs; a family with a small input space may give fewer than asked
        args = fam.args(rng, knobs)
        if args not in calls:
            calls.append(args)
        if len(calls) == 6:
            break
    example, tests = calls[0], calls[1 : 1 + rng.randint(3, 5)]
    question = (
        f"Write a Python function `{name}({fam.params})` that {fam.describe(knobs)}.\n\n"
        f"For example, `{_call(name, example)}` should return `{func(*example)!r}`.\n\n"
        + ANSWER_FORMAT.format(name=name)
    )
    return {
        "question": question,
        "tests": [f"assert {_call(name, args)} == {func(*args)!r}" for args in tests],
        "entry_point": name,
        "canonical_solution": solution,
    }


def generate_code_tasks(n: int, seed: int) -> list[dict]:
    """`n` distinct procedural tasks, deterministic in `seed`."""
    rng = random.Random(seed)
    rows, seen = [], set()
    while len(rows) < n:
        row = _task(rng)
        if row["question"] not in seen:
            seen.add(row["question"])
            rows.append({"id": f"code-{len(rows):04d}", **row})
    return rows


def write_jsonl(rows: list[dict], path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write procedural code tasks as JSONL.", allow_abbrev=False)
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="recipes/data/code_train.jsonl")
    args = parser.parse_args(argv)
    write_jsonl(generate_code_tasks(args.n, args.seed), args.out)
    print(f"wrote {args.n} tasks to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
