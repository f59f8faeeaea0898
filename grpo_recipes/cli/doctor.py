"""`grpo-recipes doctor`: check this machine, the installed packages and a recipe config before a long run.

    grpo-recipes doctor                                      # the math recipe's default config
    grpo-recipes doctor --recipe agent
    grpo-recipes doctor --config my_task.yaml --accelerate-config accelerate_configs/cpu_ddp.yaml -- --use_vllm true

Prints one row per check (ok, warn or FAIL, the detail, and the fix under each one that is not ok) and exits 1 when a
check fails, 0 otherwise. What each check does: docs/reliability.md, "Before a run: grpo-recipes doctor".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .. import bundled
from .doctor_checks import diagnose, render

DEFAULT_RECIPE = "math"


def register(subparsers) -> None:
    p = subparsers.add_parser("doctor", help="check the machine, the installed versions and a config before a run",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", help=f"recipe name: {', '.join(bundled.recipe_names())} (its config: "
                                    f"recipes/configs/<name>_cpu.yaml; default {DEFAULT_RECIPE})")
    p.add_argument("--config", help="recipe YAML to check instead of the recipe's default config")
    p.add_argument("--accelerate-config", help="the Accelerate config the run will use (default: Accelerate's "
                                               "own default file, when there is one)")
    p.add_argument("overrides", nargs=argparse.REMAINDER, help="recipe config flags, after --")
    p.set_defaults(func=run)


def run(args) -> int:
    recipe = args.recipe or (None if args.config else DEFAULT_RECIPE)
    config = Path(args.config) if args.config else bundled.recipe_config(recipe)
    if not config.is_file():
        print(f"error: no config {config} (recipes: {', '.join(bundled.recipe_names())}); pass --config YAML",
              file=sys.stderr)
        return 2
    overrides = [a for a in args.overrides if a != "--"]
    rows = diagnose(recipe, ["--config", str(config), *overrides], args.accelerate_config)
    print(render(rows))
    return 1 if any(r.status == "FAIL" for r in rows) else 0
