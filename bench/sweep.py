"""Epsilon / beta / learning-rate / loss-type sweep on the CPU default, each run to the same CPU-time budget.

    python bench/sweep.py --budget_min 6                 # every variant below
    python bench/sweep.py --only default lr_low          # a subset
    python bench/sweep.py --budget_min 30 --only default trl_defaults   # the learning run (bench/README.md)

Every run is the default math recipe (recipes/configs/math_cpu.yaml) plus the variant's flags, stopped by
`max_cpu_minutes` (CPU time inside training steps, so a busy machine slows a run down but does not shorten its
budget, and evaluation is not charged), with
held-out greedy pass@1 measured at start and end on the same 50 held-out questions. All runs land in one Trackio
project (`grpo-recipes-sweep`), named `sweep-<variant>-<budget>m[-<label>]`, so the dashboard compares them. Results are appended to
bench/results/sweep.jsonl and the table is rewritten in bench/results/sweep.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
PROJECT = "grpo-recipes-sweep"

# One factor at a time around the default (lr 1e-5, epsilon 0.2 / clip-higher 0.28, beta 0, loss dapo, temperature 1).
VARIANTS: dict[str, list[str]] = {
    "default": [],
    # TRL's own GRPOConfig defaults for the knobs the recipe tunes (same data, rewards, model, length).
    "trl_defaults": ["--learning_rate", "1e-6", "--lr_scheduler_type", "linear", "--epsilon_high", "0.2",
                     "--beta", "0.0", "--loss_type", "dapo", "--temperature", "1.0", "--stages", '["grpo"]'],
    "lr_1e-4": ["--learning_rate", "1e-4"],
    "lr_3e-5": ["--learning_rate", "3e-5"],
    "lr_3e-4": ["--learning_rate", "3e-4"],
    "eps_symmetric": ["--epsilon_high", "0.2"],
    "beta_0.04": ["--beta", "0.04"],
    "loss_grpo": ["--loss_type", "grpo"],
    "temp_0.7": ["--temperature", "0.7"],
    "loss_dr_grpo": ["--loss_type", "dr_grpo"],
    "eps_wide": ["--epsilon", "0.3", "--epsilon_high", "0.3"],
    # The default is on-policy (one optimiser step per generation batch), so the PPO ratio is exactly 1 and epsilon
    # never clips: the epsilon variants above train step for step like the default. Clipping acts only when a batch
    # is reused; these pairs measure epsilon there.
    "reuse2": ["--num_iterations", "2"],
    "reuse2_eps_symmetric": ["--num_iterations", "2", "--epsilon_high", "0.2"],
}


def trackio_summary(trackio_dir: Path, run: str) -> dict:
    db = trackio_dir / f"{PROJECT}.db"
    if not db.exists():
        return {}
    with sqlite3.connect(db) as con:
        rows = [json.loads(m) for (m,) in con.execute("SELECT metrics FROM metrics WHERE run_name = ?", (run,))]
        try:
            alerts = con.execute("SELECT COUNT(*) FROM alerts WHERE run_name = ?", (run,)).fetchone()[0]
        except sqlite3.Error:
            alerts = None
    entropy = [r["train/entropy"] for r in rows if "train/entropy" in r]
    steps = [r["train/global_step"] for r in rows if "train/loss" in r]
    return {"steps": max(steps, default=0), "entropy_first": entropy[0] if entropy else None,
            "entropy_last": entropy[-1] if entropy else None, "alerts": alerts}


def cpu_model() -> str:
    """CPU time buys different amounts of work on different processors: every record names its machine."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} x{os.cpu_count()}"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()} x{os.cpu_count()}"


def run_variant(name: str, flags: list[str], budget_min: float, trackio_dir: Path, out_root: Path,
                eval_every: int, label: str = "") -> dict:
    suffix = f"-{label}" if label else ""
    tag = f"{name}-{budget_min:g}m{suffix}"
    out = out_root / tag
    cmd = [sys.executable, str(REPO / "recipes" / "math_grpo.py"), "--max_steps", "100000",
           "--max_cpu_minutes", str(budget_min), "--output_dir", str(out), "--overwrite_output_dir", "true",
           "--project", PROJECT, "--run_name", f"sweep-{tag}", "--save_strategy", "no",
           "--eval_every_steps", str(eval_every),
           # one Trackio group per budget and machine: the runs that may be compared with each other
           "--trackio_group", f"sweep-{budget_min:g}m{suffix}", *flags]
    # PASSIVE: idle OpenMP threads sleep instead of spinning, so on a shared machine CPU time measures work done.
    env = {**os.environ, "TRACKIO_DIR": str(trackio_dir), "OMP_WAIT_POLICY": "PASSIVE"}
    start = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{proc.stderr[-3000:]}")
    summary = json.loads((out / "eval_summary.json").read_text())
    s, e = summary["start"], summary["end"]
    return {
        "variant": name, "label": label, "cpu": cpu_model(), "flags": " ".join(flags), "budget_cpu_min": budget_min,
        "wall_min": (time.time() - start) / 60,
        "pass1_start": s["pass_at_1"], "pass1_end": e["pass_at_1"], "gain": e["pass_at_1"] - s["pass_at_1"],
        "passk_start": s["pass_at_k"], "passk_end": e["pass_at_k"], "format_end": e.get("format_rate"),
        "command": "python recipes/math_grpo.py " + " ".join(shlex.quote(c) for c in cmd[2:]),
        **trackio_summary(trackio_dir, f"sweep-{tag}"),
    }


def write_table(records: list[dict]) -> None:
    lines = ["| variant | flags | machine | CPU min | steps | greedy pass@1 start -> end (gain) | pass@4 end | format end | "
             "entropy first -> last | alerts |", "|---|---|---|---|---|---|---|---|---|---|"]
    fmt = lambda v, p=3: "n/a" if v is None else f"{v:.{p}f}"  # noqa: E731
    for r in records:
        lines.append(f"| {r['variant']} | `{r['flags'] or '(default)'}` | {r.get('cpu', 'earlier machine')} | "
                     f"{r['budget_cpu_min']:g} | {r.get('steps')} | "
                     f"{fmt(r['pass1_start'])} -> {fmt(r['pass1_end'])} ({r['gain']:+.3f}) | {fmt(r['passk_end'])} | "
                     f"{fmt(r['format_end'])} | {fmt(r.get('entropy_first'), 2)} -> {fmt(r.get('entropy_last'), 2)} | "
                     f"{r.get('alerts')} |")
    (RESULTS / "sweep.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budget_min", type=float, default=6.0, help="CPU minutes per run")
    p.add_argument("--only", nargs="*", choices=list(VARIANTS), help="variants to run (default: all)")
    p.add_argument("--eval_every", type=int, default=0,
                   help="held-out evaluation every N steps besides start and end (0: start and end only)")
    p.add_argument("--label", default="", help="suffix for run names, e.g. the machine, so that runs on another "
                   "machine do not replace these curves (CPU minutes buy different work on different CPUs)")
    p.add_argument("--trackio_dir", type=Path, default=REPO / "bench" / "results" / "trackio")
    p.add_argument("--out", type=Path, default=REPO / "outputs" / "sweep")
    args = p.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    log = RESULTS / "sweep.jsonl"
    for name in args.only or list(VARIANTS):
        rec = run_variant(name, VARIANTS[name], args.budget_min, args.trackio_dir, args.out, args.eval_every, args.label)
        with open(log, "a") as f:
            f.write(json.dumps(rec) + "\n")
        print(json.dumps(rec), flush=True)
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    write_table(records)
    print((RESULTS / "sweep.md").read_text())


if __name__ == "__main__":
    main()
