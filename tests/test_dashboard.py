"""What a recipe's Trackio project shows: two runs of the math recipe that differ only by their seed, in one project.

Trackio's dashboard (0.43) shows a section per first key part (`eval/...`), keys without one first, then the
sections alphabetically, three panels a row at 1400 pixels: the held-out evaluation (eval/) and the policy's curves
(policy/) make its first screen, the training record (train/) and the timings (walltime/) follow
(grpo_recipes/state/tracking.py, "the dashboard"). The runs' names tell them apart within what the sidebar shows.
"""

import json
import sqlite3
import subprocess
import sys

from helpers import REPO, tiny_run_args


def test_two_seeds_of_the_math_recipe_in_one_project(tiny_model_dir, run_env):
    tracks = run_env / "trackio"
    for seed in ("1", "2"):
        cmd = [sys.executable, str(REPO / "recipes" / "math_grpo.py"),
               *tiny_run_args(tiny_model_dir, run_env / f"out{seed}", 2), "--seed", seed, "--trackio_dir", str(tracks)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=run_env)
        assert proc.returncode == 0, proc.stderr[-4000:]

    with sqlite3.connect(tracks / "grpo-recipes-math.db") as con:
        configs = {name: json.loads(c) for name, c in con.execute("SELECT run_name, config FROM configs")}
        rows = con.execute("SELECT run_name, metrics FROM metrics").fetchall()
    one, two = sorted(configs)
    assert one.endswith("-seed1") and two.endswith("-seed2"), (one, two)
    assert one[:24] != two[:24] and one[:-1] == two[:-1]  # the seed ends a name short enough for the sidebar
    assert configs[one]["_Group"] == configs[two]["_Group"] == one.removesuffix("-seed1")  # Trackio's group-by

    keys = {name: set() for name in configs}
    for name, metrics in rows:
        keys[name] |= {k for k, v in json.loads(metrics).items() if isinstance(v, (int, float))}
    first_screen = {"eval/format_rate", "eval/mean_length", "eval/pass@1",
                    "policy/correctness", "policy/entropy", "policy/format", "policy/mean_length"}
    for name in configs:
        assert first_screen <= keys[name], first_screen - keys[name]
        assert {"train/rewards/math_correctness/mean", "train/entropy", "train/completions/mean_length"} <= keys[name]
        assert not [k for k in keys[name] if "._" in k or "Time taken" in k or k.startswith("profiling/")]
        # Every block TRL times, named for what it times (a new or renamed one would show up here by its own name).
        assert {k for k in keys[name] if k.startswith("walltime/")} == {
            "walltime/generation", "walltime/prepare_batch", "walltime/rewards", "walltime/rewards/math_correctness",
            "walltime/rewards/boxed_format", "walltime/logprobs", "walltime/loss"}
        # Sections in Trackio's order: held-out, the policy's curves, the training record, the timings; no key
        # outside a section (those would open the page, as Trackio's "charts").
        assert sorted({k.split("/")[0] if "/" in k else "" for k in keys[name]}) == [
            "eval", "policy", "train", "walltime"]
