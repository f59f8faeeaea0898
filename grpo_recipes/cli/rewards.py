"""`grpo-recipes rewards list | check`: what rewards exist, and whether one keeps its contract on real rows.

    grpo-recipes rewards list
    grpo-recipes rewards check math_correctness --rows 8
    grpo-recipes rewards check json_schema --config recipes/configs/json_cpu.yaml
    grpo-recipes rewards check my_reward --rows-file rows.jsonl --params '{"strict": true}'
    grpo-recipes rewards check spelled_backward         # a reward in a task file: checked on that task's rows

Rewards are found as a run finds them: the reward folders (./rewards, $GRPO_RECIPES_REWARD_DIRS, the shipped ones,
--reward-dir) and the task folders (./tasks, $GRPO_RECIPES_TASK_DIRS, the shipped ones, --task-dir), whose files may
define rewards of their own. A reward a task file defines is checked on that task's rows, with the params its
defaults give it.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
from pathlib import Path

from .. import bundled
from ..config.resolve import resolve
from ..rewards import registry
from ..rewards.check import check_reward, default_rows
from ..tasks import registry as tasks
from ..tasks.data import load_splits


def register(subparsers) -> None:
    parser = subparsers.add_parser("rewards", help="list the named rewards or check one against its contract",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="rewards_command", required=True)

    ls = sub.add_parser("list", help="name, columns, params (default, accepted values), doc and source of every reward")
    ls.add_argument("--reward-dir", action="append", default=[], help="extra folder of reward files")
    ls.add_argument("--task-dir", action="append", default=[], help="extra folder of task files")
    ls.set_defaults(func=cmd_list)

    check = sub.add_parser("check", help="run one reward on rows with good, bad, malformed and fuzz completions")
    check.add_argument("name")
    check.add_argument("--config", type=Path, help="recipe YAML: its dataset gives the rows, its rewards the params")
    check.add_argument("--rows-file", type=Path, help="JSONL file of rows (instead of --config)")
    check.add_argument("--rows", type=int, default=8, help="number of rows to use (default 8)")
    check.add_argument("--params", default=None, help="JSON object of params; overrides the config's")
    check.add_argument("--seed", type=int, default=0)
    check.add_argument("--no-fuzz", action="store_true", help="skip the huge random completions")
    check.add_argument("--reward-dir", action="append", default=[], help="extra folder of reward files")
    check.add_argument("--task-dir", action="append", default=[], help="extra folder of task files")
    check.set_defaults(func=cmd_check)


def _relative(path: str) -> str:
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def known_rewards(reward_dirs: list, task_dirs: list) -> tuple[dict, dict]:
    """(rewards by name, tasks by name), loaded as a run loads them: the task files may define rewards too."""
    task_classes = tasks.available(task_dirs)
    return registry.available(reward_dirs), task_classes


def cmd_list(args) -> int:
    for rdef in known_rewards(args.reward_dir, args.task_dir)[0].values():
        print(f"{rdef.name}  ({_relative(rdef.source)})")
        print(f"    {rdef.doc or '(no docstring)'}")
        print(f"    columns: {', '.join(rdef.columns) or '-'}    params:{'' if rdef.params else ' -'}")
        for line in rdef.describe_params():
            print(f"      {line}")
    return 0


def _config_rows(path: Path, n: int):
    """(rows, params-from-config, reward_dirs) from a recipe YAML, through the recipe's own data loader."""
    config = resolve(["--config", str(path)])
    recipe = config.recipe
    train, _held_out = load_splits(recipe, config.task)
    rows = train.select(range(min(n, len(train)))).to_list()
    return rows, recipe.reward_specs, list(recipe.reward_dirs or [])


def _task_rows(rdef, task_classes: dict, n: int):
    """(rows, the params the task gives the reward) when a task file defines `rdef`, else None: the task's own
    training rows, through the recipe's data loader."""
    name = next((n for n, cls in task_classes.items() if Path(inspect.getsourcefile(cls)) == Path(rdef.source)), None)
    if name is None:
        return None
    config = resolve(["--task", name, "--train_size", str(n), "--eval_size", "0", "--report_to", "none"], name=name)
    train, _held_out = load_splits(config.recipe, config.task)
    params = next((s.params for s in config.recipe.reward_specs if s.name == rdef.name), {})
    return train.select(range(min(n, len(train)))).to_list(), params


def _file_rows(path: Path, n: int) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                rows.append(json.loads(line))
            if len(rows) >= n:
                break
    return rows


def cmd_check(args) -> int:
    try:
        params = json.loads(args.params) if args.params else {}
        if not isinstance(params, dict):
            raise ValueError(f"--params: expected a JSON object, got {args.params!r}")
        if args.rows < 1:
            raise ValueError(f"--rows: expected at least 1, got {args.rows}")
        specs, dirs = [], list(args.reward_dir)
        if args.config:
            rows, specs, config_dirs = _config_rows(args.config, args.rows)
            dirs += config_dirs
        elif args.rows_file:
            rows = _file_rows(args.rows_file, args.rows)
        known, task_classes = known_rewards(dirs, args.task_dir)
        if args.name not in known:
            searched = [*bundled.REWARDS.dirs(dirs), *bundled.TASKS.dirs(args.task_dir)]
            raise ValueError(f"unknown reward '{args.name}'; known: {', '.join(known)} (searched "
                             f"{', '.join(map(str, searched))}; --reward-dir and --task-dir add folders)")
        rdef = known[args.name]
        from_config = next((s.params for s in specs if s.name == args.name), {})
        if not (args.config or args.rows_file):
            own = _task_rows(rdef, task_classes, args.rows)
            rows, from_config = own if own is not None else (default_rows(rdef, args.rows, args.seed), {})
        spec = registry.RewardSpec(args.name, params={**from_config, **params})
        problems = registry.check_specs([spec], known, columns=set(rows[0]) if rows else None)
        if not rows:
            problems.append("no rows to check with")
        if problems:
            raise ValueError("; ".join(problems))
    except (ValueError, KeyError, OSError) as exc:
        print(f"rewards check: {exc}", file=sys.stderr)
        return 2
    report = check_reward(rdef, rows, spec.params, seed=args.seed, fuzz=not args.no_fuzz)
    report.source = _relative(report.source)
    print(report.render())
    return 0 if report.ok else 1
