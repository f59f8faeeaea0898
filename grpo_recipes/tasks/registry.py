"""Tasks: one unit of work, found by name like rewards and tools (docs/tasks.md).

A task is a class in a file under a tasks folder (`task_dirs`, $GRPO_RECIPES_TASK_DIRS, ./tasks, the shipped
tasks/), registered with `@task("name")` and chosen with `task: name` in a recipe's YAML. It holds what a recipe
needs to know about its problems and nothing about training:

    @task("spell_backward")
    class SpellBackward(Task):
        defaults = {"rewards": [{"name": "exact_answer"}], "prompt_template": "Spell {word} backward."}

        def rows(self, recipe):                 # the data source: rows with `question` and `answer` (+ columns)
            ...
        def prepare(self, row, recipe):         # a row as the task uses it: its demonstration, or None to drop it
            return {**row, "demonstration": f"\\boxed{{{row['answer']}}}"}

- `defaults`: values of RecipeArguments fields (its rewards and strict verifier `correctness_reward`, its prompt,
  its `demonstration_field`, its data settings) used where the config leaves the field at its default.
- `rows(recipe)`: the rows to train on and carve the held-out split from; None (the default) reads
  `dataset_source` as usual (reasoning_gym, hub, file).
- `held_out(recipe)`: a held-out set of its own, never trained on; None carves one out of the rows.
- `prepare(row, recipe)`: every row, training and held-out, passes through it; it returns the row with the columns
  the task adds (demonstrations for an sft stage, what its rewards read), or None to drop the row.
A reward the task needs can sit in the same file (`@reward`), so a new task is one file and a YAML.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

from .. import bundled
from ..values import did_you_mean

ENV_TASK_DIRS = "GRPO_RECIPES_TASK_DIRS"
_MODULE_PREFIX = "grpo_recipes._loaded_tasks"
_TASKS: dict[str, type[Task]] = {}
ROLE_FIELDS = ("correctness_reward", "format_reward")  # they name rewards: defaults only with the task's rewards


class Task:
    """The base of every task: each hook's default is the generic behaviour."""

    defaults: dict[str, Any] = {}
    reads: tuple[str, ...] = ()  # RecipeArguments fields the task itself implements (the arithmetic task's gold check)

    def rows(self, recipe) -> list[dict] | None:
        return None

    def held_out(self, recipe) -> list[dict] | None:
        return None

    def prepare(self, row: dict, recipe) -> dict | None:
        return row


def task(name: str):
    """Register a Task subclass under `name`; a second, different class under the same name is an error."""

    def register(cls: type[Task]) -> type[Task]:
        if not (isinstance(cls, type) and issubclass(cls, Task)):
            raise TypeError(f"task '{name}': @task registers a subclass of grpo_recipes.tasks.registry.Task, got {cls!r}")
        old = _TASKS.get(name)
        if old is not None and (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__):
            raise ValueError(f"task name '{name}' is defined twice: in {old.__module__} and in {cls.__module__}")
        _TASKS[name] = cls
        return cls

    return register


def task_dirs(extra: Iterable[str | os.PathLike] = ()) -> list[Path]:
    """Folders searched for task files: config-given, then $GRPO_RECIPES_TASK_DIRS, ./tasks, the shipped ones."""
    return bundled.search_dirs(extra, ENV_TASK_DIRS, "tasks", bundled.tasks_dir())


def available(extra: Iterable[str | os.PathLike] = ()) -> dict[str, type[Task]]:
    bundled.load_files(task_dirs(extra), _MODULE_PREFIX, "task")
    return dict(sorted(_TASKS.items()))


def problems(recipe) -> list[str]:
    """The configured task's name and defaults, checked before anything loads."""
    try:
        known = available(recipe.task_dirs or ())
    except ImportError as exc:  # a task file that does not import names itself
        return [f"task_dirs: {exc}"]
    if not recipe.task:
        return read_problems(recipe, known)
    if recipe.task not in known:
        close = did_you_mean(recipe.task, known)
        hint = f"did you mean '{close}'?" if close else f"known tasks: {', '.join(known) or 'none'}"
        return [f"task: unknown task '{recipe.task}'; {hint} (task files: {', '.join(map(str, task_dirs(recipe.task_dirs or ())))})"]
    names = {f.name for f in fields(recipe)}
    out = [f"task: {recipe.task}'s defaults set '{k}', which is not a recipe field"
           for k in known[recipe.task].defaults if k not in names]
    return out + read_problems(recipe, known)


def read_problems(recipe, known: dict[str, type[Task]]) -> list[str]:
    """A field that only a task implements, set for a run whose task does not read it: it would do nothing."""
    out = []
    for name in ("gold_check_tool",):
        if getattr(recipe, name) and name not in (known[recipe.task].reads if recipe.task else ()):
            readers = [n for n, cls in known.items() if name in cls.reads]
            current = f"task {recipe.task} does not read it" if recipe.task else "no task is set"
            out.append(f"{name}: {current}; the {', '.join(readers) or 'no'} task does. Fix: task: "
                       f"{readers[0] if readers else '...'}, or unset {name}")
    return out


def load(recipe) -> Task | None:
    """The configured task (checked by `problems`), or None."""
    return available(recipe.task_dirs or ())[recipe.task]() if recipe.task else None


def apply_defaults(recipe, unit: Task | None) -> None:
    """The task's defaults, for every RecipeArguments field the config left at its default."""
    if unit is None or not unit.defaults:
        return
    by_name = {f.name: f for f in fields(recipe)}
    explicit = getattr(recipe, "set_fields", None)  # parsing.parse_recipe_args records what the user set
    changed = False
    for key, value in unit.defaults.items():
        if key in ROLE_FIELDS and explicit is not None and "rewards" in explicit:
            continue  # the task's roles name its own rewards, which the config replaced
        f = by_name[key]
        default = f.default if f.default is not MISSING else f.default_factory()
        unset = key not in explicit if explicit is not None else getattr(recipe, key) == _normalised(key, default)
        if unset:
            setattr(recipe, key, value)
            changed = True
    if changed:
        recipe.__post_init__()  # rewards -> reward_specs, few_shot and gym_params read again


def _normalised(key: str, default: Any) -> Any:
    # __post_init__ turns some unset fields into empty containers: compare with what the default became.
    return {"gym_params": {}, "few_shot": [], "tools": [], "stages": [{"name": "grpo"}]}.get(key, default) \
        if default is None else default
