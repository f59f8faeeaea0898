"""Where the default math run spends its time and memory, phase by phase: the default as shipped vs the old one.

    python bench/profile_default.py                 # both arms, 2 training steps each, held-out evaluation at both ends
    python bench/profile_default.py --steps 3 --arms after
    python bench/profile_default.py --eval_rows 16       # both arms evaluate 16 rows: eval then reads per row

Each arm is its own process (a clean peak RSS), one after the other on the same machine in the same run; the table
gives each phase's seconds per training step (per call for `setup` and `eval`), its peak RSS, and the after/before ratio.
Phases are exclusive: a phase's time excludes the phases nested in it (`gen+score+logps` is TRL's
_generate_and_score_completions minus generation and scoring: the old-policy log-probabilities and advantages).

- before: the math default until this change: two few-shot turns, 16 sequences per forward/backward
  (per_device_train_batch_size 16), 50 held-out rows with greedy + 4 samples each, OpenMP's active waiting.
- after: recipes/configs/math_cpu.yaml as shipped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OLD_FEW_SHOT = json.dumps([
    {"question": "Calculate 2 + 5.", "completion": "2 + 5 = 7. \\boxed{7}"},
    {"question": "Calculate -( 8 - 3 ).", "completion": "8 - 3 = 5, so -( 8 - 3 ) = -5. \\boxed{-5}"},
])
ARMS = {
    "before": {"flags": ["--few_shot", OLD_FEW_SHOT, "--per_device_train_batch_size", "16",
                         "--gradient_accumulation_steps", "1", "--eval_size", "50", "--eval_k", "4"],
               "env": {"OMP_WAIT_POLICY": "ACTIVE"}},
    "after": {"flags": [], "env": {}},
}
PHASES = ["setup", "generate", "score", "gen+score+logps", "loss_forward", "backward", "optimizer", "training_step",
          "eval", "other"]


class Profiler:
    """Exclusive wall/CPU time per phase, and the peak RSS seen while each phase was innermost (sampled every 10 ms)."""

    def __init__(self):
        self.stack = ["other"]
        self.wall, self.cpu, self.peak, self.calls = (defaultdict(float), defaultdict(float), defaultdict(int),
                                                      defaultdict(int))
        self._child = [0.0]  # wall time of nested phases, per level, so that each level reports its own share
        self._child_cpu = [0.0]
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self):
        page = os.sysconf("SC_PAGE_SIZE")
        while True:
            with open("/proc/self/statm") as f:
                rss = int(f.read().split()[1]) * page
            name = self.stack[-1]
            self.peak[name] = max(self.peak[name], rss)
            time.sleep(0.01)

    @contextlib.contextmanager
    def phase(self, name):
        self.stack.append(name)
        self._child.append(0.0)
        self._child_cpu.append(0.0)
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            self.wall[name] += wall - self._child.pop()
            self.cpu[name] += cpu - self._child_cpu.pop()
            self.calls[name] += 1
            self._child[-1] += wall
            self._child_cpu[-1] += cpu
            self.stack.pop()

    def wrap(self, owner, method, name):
        original = getattr(owner, method)

        def timed(*args, **kwargs):
            with self.phase(name):
                return original(*args, **kwargs)

        setattr(owner, method, timed)


def run_arm(steps: int, out: Path, argv: list[str], eval_rows: int | None) -> dict:
    """One arm in this process: the default recipe with every phase timed."""
    import accelerate
    import torch

    from grpo_recipes.evaluation.heldout import HeldOutEvalCallback
    from grpo_recipes.grpo.trainer import RecipeTrainer
    from grpo_recipes.run import runner

    prof = Profiler()
    for owner, method, name in [
        (RecipeTrainer, "_generate", "generate"), (RecipeTrainer, "_calculate_rewards", "score"),
        (RecipeTrainer, "_generate_and_score_completions", "gen+score+logps"),
        (RecipeTrainer, "compute_loss", "loss_forward"), (RecipeTrainer, "training_step", "training_step"),
        (accelerate.Accelerator, "backward", "backward"), (torch.optim.AdamW, "step", "optimizer"),
        (HeldOutEvalCallback, "_evaluate", "eval"),
    ]:
        prof.wrap(owner, method, name)
    flags = ["--max_steps", str(steps), "--stages", '["grpo"]', "--eval_every_steps", str(steps),
             "--output_dir", str(out),
             "--overwrite_output_dir", "true", "--save_strategy", "no", "--report_to", "none", *argv]
    flags += ["--eval_size", str(eval_rows)] if eval_rows else []
    start = time.perf_counter()
    with prof.phase("setup"):
        run = runner.prepare("math", flags, REPO / "recipes" / "configs" / "math_cpu.yaml")
        trainer = runner.build_trainer(run)
    runner.train_and_save(trainer, run)
    return {"steps": steps, "total_s": time.perf_counter() - start, "threads": torch.get_num_threads(),
            "eval_rows": len(run.held_out),
            "phases": {k: {"s": prof.wall[k], "cpu_s": prof.cpu[k], "peak_gb": prof.peak[k] / 2**30,
                           "calls": prof.calls[k]} for k in PHASES if k in prof.wall or k in prof.peak}}


def per_unit(result: dict, phase: str) -> float:
    p = result["phases"].get(phase, {})
    if not p:
        return 0.0
    return p["s"] / (p["calls"] if phase in ("setup", "eval") else result["steps"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=2, help="training steps per arm")
    p.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    p.add_argument("--eval_rows", type=int, help="held-out rows for both arms (default: each arm's own)")
    p.add_argument("--out", type=Path, default=REPO / "outputs" / "profile_default")
    p.add_argument("--arm", choices=list(ARMS), help=argparse.SUPPRESS)  # the child process of one arm
    p.add_argument("--json", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.arm:
        result = run_arm(args.steps, args.out / args.arm, ARMS[args.arm]["flags"], args.eval_rows)
        args.json.write_text(json.dumps(result))
        return
    results = {}
    for arm in args.arms:
        path = args.out / f"{arm}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", **ARMS[arm]["env"]}
        cmd = [sys.executable, __file__, "--arm", arm, "--steps", str(args.steps), "--out", str(args.out),
               "--json", str(path)] + (["--eval_rows", str(args.eval_rows)] if args.eval_rows else [])
        subprocess.run(cmd, env=env, check=True)
        results[arm] = json.loads(path.read_text())
    print(f"\n{'phase':<16}" + "".join(f"{arm + ' s':>11}{arm + ' GB':>11}" for arm in results)
          + ("   ratio s" if len(results) == 2 else ""))
    for phase in PHASES:
        row = f"{phase:<16}"
        for r in results.values():
            row += f"{per_unit(r, phase):>11.1f}{r['phases'].get(phase, {}).get('peak_gb', 0):>11.2f}"
        if len(results) == 2:
            b, a = (per_unit(results[k], phase) for k in ("before", "after"))
            row += f"{a / b:>10.2f}" if b else ""
        print(row)
    for arm, r in results.items():
        print(f"{arm}: eval {per_unit(r, 'eval') / r['eval_rows']:.2f} s per held-out row ({r['eval_rows']} rows)")
        peak = max(v["peak_gb"] for v in r["phases"].values())
        print(f"{arm}: {r['total_s']:.0f} s for {r['steps']} steps and 2 evaluations, peak RSS {peak:.2f} GB, "
              f"{r['threads']} threads")


if __name__ == "__main__":
    main()
