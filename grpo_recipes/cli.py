"""`grpo-recipes` command. Each subcommand lives in its own module and is imported only when used."""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> module with `register(subparsers)`; the module's parser sets `func(args) -> int`.
SUBCOMMANDS = {
    "rewards": "grpo_recipes.reward_cli",
    "eval": "grpo_recipes.evaluate",
    "launch": "grpo_recipes.launch",
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="grpo-recipes", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    wanted = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    for name, module in SUBCOMMANDS.items():
        if wanted in (None, name):
            try:
                importlib.import_module(module).register(sub)
            except ModuleNotFoundError as exc:
                if exc.name != module:
                    raise
                sub.add_parser(name, help="(not available in this install)")
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
