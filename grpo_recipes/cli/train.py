"""`grpo-recipes train`: run a recipe, as `accelerate launch recipes/<name>_grpo.py` does in a checkout. The recipes
and their configs come with the package, so this works from an installed wheel too.

    grpo-recipes train                                       # the math recipe with its default config
    grpo-recipes train --recipe json --max_steps 20          # recipe flags follow, as with the recipe scripts
    grpo-recipes train --config my_task.yaml                 # any config (recipes/train.py)
    grpo-recipes train --recipe json --help                  # this, then every field the recipe's config takes
    accelerate launch -m grpo_recipes.cli train --recipe math   # several processes: an Accelerate config decides
"""

from __future__ import annotations

import argparse
import sys

from .. import bundled
from ..config.files import split_config_arg
from ..run.runner import main

DEFAULT_RECIPE = "math"


def register(subparsers) -> None:
    # No -h of its own: --help reaches the recipe, which lists every field (after this command's own text).
    p = subparsers.add_parser("train", help="run a recipe: the shipped ones by name, or any config", add_help=False,
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", help=f"recipe name: {', '.join(bundled.recipe_names())} (its config: "
                                    f"recipes/configs/<name>_cpu.yaml; default {DEFAULT_RECIPE} unless --config "
                                    "names a config)")
    p.set_defaults(func=run, takes_recipe_flags=True)


def run(args) -> int:
    flags = list(args.recipe_flags)
    if {"-h", "--help"} & set(flags):
        print(__doc__)
    config, _ = split_config_arg(flags)
    if args.recipe is None and config is not None:
        return main(None, argv=flags)  # named after the config's task, as recipes/train.py
    recipe = args.recipe or DEFAULT_RECIPE
    if recipe not in bundled.recipe_names():
        print(f"error: --recipe {recipe}: not a shipped recipe ({', '.join(bundled.recipe_names())}); pass "
              "--config YAML for another", file=sys.stderr)
        return 2
    return main(recipe, default_config=bundled.recipe_config(recipe), argv=flags)
