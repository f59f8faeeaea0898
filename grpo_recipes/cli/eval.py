"""`grpo-recipes eval`: evaluate any checkpoint on a recipe's held-out split with the recipe's own verifier.

    grpo-recipes eval --recipe math --model outputs/math_grpo
    grpo-recipes eval --recipe json --model outputs/json_grpo --limit 20 -- --max_completion_length 96

The recipe's config comes with the package (bundled.recipe_config), so this works from an installed wheel too.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from .. import bundled
from ..errors import ConfigError, ModelNotFound
from ..evaluation.heldout import EvalSettings, eos_token_ids, evaluate, reward_roles, summarise
from ..run.runner import prepare
from ..stages.grpo import tool_kwargs
from ..state.models import resolve_model


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "eval", help="Evaluate a model on a recipe's held-out split (pass@1, pass@k, format rate, length).",
        description="Evaluate a checkpoint with the recipe's own verifier on the recipe's held-out split. Recipe "
                    "config fields can follow `--`, e.g. `-- --eval_size 20 --max_completion_length 64`.",
    )
    p.add_argument("--recipe", required=True,  # the names come from the shipped configs, so the help cannot go stale
                   help=f"recipe name: {', '.join(bundled.recipe_names())} "
                        "(its config: recipes/configs/<name>_cpu.yaml)")
    p.add_argument("--config", help="recipe YAML to read instead of the recipe's default config")
    p.add_argument("--model", required=True, help="model folder or Hub id (e.g. outputs/math_grpo)")
    p.add_argument("--limit", type=int, help="evaluate at most N held-out rows")
    p.add_argument("--k", type=int, help="samples per prompt for pass@k; 0: greedy pass@1 only (default: the config's "
                                        "eval_k)")
    p.add_argument("--output", help="also write the result as JSON to this file")
    p.add_argument("overrides", nargs=argparse.REMAINDER, help="recipe config flags, after --")
    p.set_defaults(func=run)


def run(args) -> int:
    config = Path(args.config) if args.config else bundled.recipe_config(args.recipe)
    if not config.is_file():
        print(f"error: --recipe {args.recipe}: no config {config} (recipes: {', '.join(bundled.recipe_names())}); "
              "pass --config YAML", file=sys.stderr)
        return 2
    overrides = [a for a in args.overrides if a != "--"]
    for flag, value, least in (("--k", args.k, 0), ("--limit", args.limit, 1)):
        if value is not None and value < least:
            print(f"error: {flag}: must be >= {least}, got {value}", file=sys.stderr)
            return 2
    try:
        # for_training=False: the config's output_dir may well hold the checkpoints of the run being evaluated.
        prepared = prepare(args.recipe, ["--config", str(config), *overrides, "--model_name_or_path", args.model],
                           for_training=False)
        model_path, source = resolve_model(args.model, prepared.recipe.model_cache_dir)
    except (ConfigError, ModelNotFound) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    recipe, held_out = prepared.recipe, prepared.held_out
    if held_out is None or not len(held_out):
        print("error: the recipe has no held-out rows (eval_size is 0)", file=sys.stderr)
        return 2
    rows = held_out.to_list()[: args.limit] if args.limit else held_out.to_list()
    correctness, fmt = reward_roles(recipe, prepared.funcs)
    settings = EvalSettings.from_configs(recipe, prepared.training, k=args.k)
    if recipe.uses_tools:  # multi-turn episodes with the recipe's tools and tool template
        try:
            tooling = tool_kwargs(recipe, model_path)
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        tokenizer, settings.tools = tooling["processing_class"], tooling["tools"]
    else:
        tokenizer = AutoTokenizer.from_pretrained(model_path)
    kwargs = {"dtype": prepared.model_args.dtype} if prepared.model_args.dtype else {}
    model = AutoModelForCausalLM.from_pretrained(model_path, **kwargs)
    if torch.cuda.is_available():
        model = model.to("cuda")
    records, seconds = evaluate(model, tokenizer, rows, correctness, fmt, settings, eos_token_ids(model, tokenizer))
    result = summarise(records, settings, fmt is not None, seconds)
    report = {"recipe": args.recipe, "model": args.model, "model_path": model_path, "source": source,
              "correctness_reward": correctness.__name__, "format_reward": fmt.__name__ if fmt else None,
              **asdict(result)}
    print(json.dumps(report, indent=2))
    if args.output:
        Path(args.output).write_text(json.dumps(report, indent=2) + "\n")
    return 0
