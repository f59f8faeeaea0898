"""Throughput of `math_correctness` (both answer forms) against TRL's `accuracy_reward`, same completions, one run.

    python bench/math_reward_throughput.py [--batches 20] [--batch-size 64] [--pool-workers 2]

The mix imitates a GSM8K-style run with a \\boxed{} instruction: mostly boxed integers (right and wrong), some
LaTeX forms, unboxed answers and long answerless reasoning. Each gold repeats once per generation (8), as in GRPO.
Both rewards get the completions as chat messages would give them. `answer_form: literal` decides without sympy;
`expression` sends what is not a number literal to its math-verify process. The last line also times the literal
form split over a warm process pool, to show whether parallel verification pays at this batch size. Then the hack
catalog's slow shapes (grpo_recipes/rewards/hacks.py: 24 boxes of ~800 characters, mostly spaces; a sign, ~800 spaces and a
digit in one box) against a plain completion of the same length, under the math default's two rewards, in the same
run: the ratio shows whether a completion's shape can make scoring the bottleneck.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import time
from concurrent.futures import ProcessPoolExecutor

os.environ.setdefault("HF_HUB_OFFLINE", "1")

GENERATIONS = 8


def reasoning(rng: random.Random, chars: int) -> str:
    steps = []
    while sum(map(len, steps)) < chars:
        a, b = rng.randint(2, 999), rng.randint(2, 99)
        steps.append(rng.choice([f"First, {a} + {b} = {a + b}.", f"Then {a} x {b} = {a * b}.",
                                 f"So we subtract: {a} - {b} = {a - b}.", f"Half of {a * 2} is {a}."]))
    return " ".join(steps)


def _kind(text: str) -> str:
    if "\\frac" in text:
        return "unreduced \\frac"
    return "boxed" if "\\boxed" in text else "unboxed" if "answer is" in text else "no answer"


def completion(rng: random.Random, gold: int) -> str:
    think = reasoning(rng, rng.randint(200, 1500))
    kind = rng.random()
    if kind < 0.45:
        return f"{think}\nThe answer is \\boxed{{{gold}}}."
    if kind < 0.70:
        return f"{think}\nThe answer is \\boxed{{{gold + rng.choice([-10, -1, 1, 2, 100])}}}."
    if kind < 0.78:
        return f"{think}\nSo the answer is $\\boxed{{{gold}}}$"
    if kind < 0.85:
        return f"{think}\n\\boxed{{\\frac{{{2 * gold}}}{{2}}}}"
    if kind < 0.95:
        return f"{think}\nThe answer is {gold}."
    return reasoning(rng, rng.randint(2000, 4000))  # truncated: no answer at all


def batches(n: int, size: int, seed: int = 0) -> list[tuple[list[str], list[str]]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        golds = [rng.randint(1, 5000) for _ in range(size // GENERATIONS)]
        texts, answers = [], []
        for gold in golds:
            for _ in range(GENERATIONS):
                texts.append(completion(rng, gold))
                answers.append(str(gold))
        out.append((texts, answers))
    return out


def _math_correctness():
    from grpo_recipes.rewards.registry import available

    return available()["math_correctness"].func


def ours(texts: list[str], answers: list[str], form: str = "literal") -> list:
    return _math_correctness()(texts, answers, log_metric=lambda name, value: None, answer_form=form)


def ours_expression(texts: list[str], answers: list[str]) -> list:
    return ours(texts, answers, "expression")


def trl_accuracy(texts: list[str], answers: list[str]) -> list:
    from trl.rewards import accuracy_reward

    return accuracy_reward([[{"role": "assistant", "content": t}] for t in texts], answers)


def timed(fn, data) -> tuple[float, list]:
    fn(*data[0])  # warm-up: imports, regex compilation
    start = time.perf_counter()
    results = [fn(*batch) for batch in data]
    return time.perf_counter() - start, results


def pooled(pool: ProcessPoolExecutor, workers: int):
    def run(texts, answers):
        chunk = -(-len(texts) // workers)
        parts = [(texts[i : i + chunk], answers[i : i + chunk]) for i in range(0, len(texts), chunk)]
        return [s for part in pool.map(ours, *zip(*parts)) for s in part]

    return run


def slow_shapes(repeats: int = 5) -> None:
    from grpo_recipes.rewards import hacks
    from grpo_recipes.rewards.registry import available

    rewards = available()
    defaults = {"answer_form": "literal", "check_working": True, "check_equations": True}  # tasks/arithmetic.py

    def both(text: str) -> float:
        start = time.perf_counter()
        rewards["math_correctness"].func([text], ["7"], lambda *a: None, **defaults)
        rewards["boxed_format"].func([text], numeric=True)
        return time.perf_counter() - start

    for name in ("padded_boxes", "padded_sign_box"):
        text = next(h for h in hacks.CATALOG if h.name == name).make({}, {})
        plain = ("Let me think. " * (len(text) // 14 + 1))[: len(text) - 16] + " \\boxed{7}."
        shape, base = (min(both(t) for _ in range(repeats)) for t in (text, plain))
        print(f"slow shape {name:<16}: {shape * 1e3:8.2f} ms a completion over both rewards, {base * 1e3:.2f} ms for a "
              f"plain one of the same length ({len(text)} chars): {shape / base:.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--pool-workers", type=int, default=2)
    args = parser.parse_args()
    data = batches(args.batches, args.batch_size)
    n = sum(len(t) for t, _ in data)

    t_trl, r_trl = timed(trl_accuracy, data)
    t_lit, r_lit = timed(ours, data)
    t_expr, r_expr = timed(ours_expression, data)
    texts = [t for batch, _ in data for t in batch]
    flat_trl = [s for r in r_trl for s in r]
    chars = sum(map(len, texts)) / n
    print(f"{n} completions in batches of {args.batch_size}, mean {chars:.0f} chars")
    accuracy = sum(map(bool, flat_trl)) / n
    print(f"trl accuracy_reward          : {n / t_trl:8.1f} completions/s   (accuracy {accuracy:.2f})")
    for label, seconds, results in (("literal", t_lit, r_lit), ("expression", t_expr, r_expr)):
        flat = [s for r in results for s in r]
        print(f"math_correctness {label:<11} : {n / seconds:8.1f} completions/s   (accuracy "
              f"{sum(map(bool, flat)) / n:.2f})   {t_trl / seconds:6.2f}x trl")
        # Where the verdicts differ, and why: TRL reads no unboxed answer ("The answer is 42."); the literal form
        # refuses \frac{2g}{2}, a fraction not in lowest terms.
        kinds = collections.Counter(_kind(t) for t, a, b in zip(texts, flat_trl, flat) if a != b)
        print(f"    verdicts that differ from trl: {dict(kinds) or 'none'}")
    slow_shapes()
    with ProcessPoolExecutor(args.pool_workers) as pool:
        t_pool, r_pool = timed(pooled(pool, args.pool_workers), data)
    assert r_pool == r_lit
    print(f"math_correctness literal, {args.pool_workers}-process pool: {n / t_pool:8.1f} completions/s "
          f"({t_lit / t_pool:.2f}x serial; {os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
