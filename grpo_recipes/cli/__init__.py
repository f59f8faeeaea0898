"""`grpo-recipes` command: `train`, `rewards` (list, check), `eval`, `launch` and `doctor`, one module per subcommand.

Each module has `register(subparsers)`, whose parser sets `func(args) -> exit code`. Only the module of the
subcommand being run is imported (all of them for `--help`): `launch` needs neither TRL nor the datasets stack, and
the launcher must start in a blink.
"""

from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMANDS = {
    "train": "grpo_recipes.cli.train",
    "rewards": "grpo_recipes.cli.rewards",
    "eval": "grpo_recipes.cli.eval",
    "launch": "grpo_recipes.cli.launch",
    "doctor": "grpo_recipes.cli.doctor",
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="grpo-recipes", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    wanted = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    for name, module in SUBCOMMANDS.items():
        if wanted in (None, name):
            importlib.import_module(module).register(sub)
    args, rest = parser.parse_known_args(argv)
    if getattr(args, "takes_recipe_flags", False):  # `train`: what follows its own options are the recipe's flags
        args.recipe_flags = rest
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return int(args.func(args) or 0)
