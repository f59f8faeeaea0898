"""Overhead of this layer against bare TRL: the default math config, same model, data, rewards and seed.

    python bench/overhead.py                     # real SmolLM2-135M, 3 rounds x 3 steps per side
    python bench/overhead.py --model /path/tiny  # any local model, e.g. a tiny one for a quick look

Each trial is its own process (peak RSS is per process), and the two sides alternate (layer, bare, layer, ...)
so that a machine slowing down mid-run hurts both equally. Reports median step time and peak-memory ratios.
The layer side runs with diagnostics and alerts on and held-out evaluation off (its cost is in
bench/diagnostics_overhead.py); both sides log nowhere (report_to none), so Trackio I/O is not measured.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "recipes" / "configs" / "math_cpu.yaml"


def trial(side: str, steps: int, model: str | None, out: Path) -> dict:
    from transformers import TrainerCallback

    from grpo_recipes.run import runner

    argv = ["--max_steps", str(steps), "--stages", '["grpo"]', "--output_dir", str(out),
            "--report_to", "none", "--save_strategy", "no",
            "--eval_heldout", "false", "--logging_steps", "1"]
    if model:
        argv += ["--model_name_or_path", model]
    run = runner.prepare("math", argv, CONFIG)
    recipe, grpo, model_args, train, funcs = run.recipe, run.training, run.model_args, run.train, run.funcs
    if side == "layer":
        trainer = runner.build_trainer(run)
    else:
        from trl import GRPOTrainer

        from grpo_recipes.state.models import prepare_model

        path = prepare_model(model_args, recipe.model_cache_dir)
        trainer = GRPOTrainer(model=path, reward_funcs=funcs, args=grpo, train_dataset=train)

    times: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.t)

    trainer.add_callback(StepTimer())
    trainer.train()
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"side": side, "step_s": times, "peak_mb": peak_mb}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--model", default=None, help="model folder or id (default: the recipe's model)")
    p.add_argument("--trial", choices=["layer", "bare"], help=argparse.SUPPRESS)
    p.add_argument("--json", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.trial:
        with tempfile.TemporaryDirectory() as tmp:
            result = trial(args.trial, args.steps, args.model, Path(tmp))
        args.json.write_text(json.dumps(result))
        return
    results = {"layer": [], "bare": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for side in ("layer", "bare") if r % 2 == 0 else ("bare", "layer"):
                out = Path(tmp) / f"{side}{r}.json"
                cmd = [sys.executable, __file__, "--trial", side, "--steps", str(args.steps), "--json", str(out)]
                if args.model:
                    cmd += ["--model", args.model]
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                res = json.loads(out.read_text())
                results[side].append(res)
                print(f"round {r} {side:5s} step_s={[round(t, 2) for t in res['step_s']]} peak={res['peak_mb']:.0f}MB",
                      flush=True)
    # The first step of a trial also warms caches; both sides have one, and the median damps it.
    step = {s: statistics.median(t for res in rs for t in res["step_s"]) for s, rs in results.items()}
    peak = {s: statistics.median(res["peak_mb"] for res in rs) for s, rs in results.items()}
    print(f"\nmedian step time  layer {step['layer']:.2f}s  bare {step['bare']:.2f}s  "
          f"ratio {step['layer'] / step['bare']:.3f}  (goal <= 1.03)")
    print(f"median peak RSS   layer {peak['layer']:.0f}MB  bare {peak['bare']:.0f}MB  "
          f"ratio {peak['layer'] / peak['bare']:.3f}")


if __name__ == "__main__":
    main()
