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
from typing import Any

from .. import bundled
from ..values import did_you_mean

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
            raise TypeError(f"task '{name}': @task registers a subclass of grpo_recipes.tasks.Task, got {cls!r}")
        old = _TASKS.get(name)
        if old is not None and (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__):
            raise ValueError(f"task name '{name}' is defined twice: in {old.__module__} and in {cls.__module__}")
        _TASKS[name] = cls
        return cls

    return register


def available(extra: Iterable[str | os.PathLike] = ()) -> dict[str, type[Task]]:
    bundled.TASKS.load(extra)
    return dict(sorted(_TASKS.items()))


def resolve(name: str | None, dirs: Iterable[str | os.PathLike], fields: set[str],
            settings: set[str] = frozenset()) -> tuple[Task | None, list[str]]:
    """(the task `name` names, or None when it is unset; its problems): an unknown task, or defaults that name no
    recipe field (`fields`, RecipeArguments'; `settings`: the training and model fields, which a config sets, not a
    task). Loads the task files, nothing else."""
    try:
        known = available(dirs)
    except ImportError as exc:  # a task file that does not import names itself
        return None, [f"task_dirs: {exc}"]
    if not name:
        return None, []
    if name not in known:
        close = did_you_mean(name, known)
        hint = f"did you mean '{close}'?" if close else f"known tasks: {', '.join(known) or 'none'}"
        where = ", ".join(map(str, bundled.TASKS.dirs(dirs)))
        return None, [f"task: unknown task '{name}'; {hint} (task files: {where})"]
    unit, problems = known[name](), []
    for key in (k for k in unit.defaults if k not in fields):
        if key in settings:
            why = "a training setting: a task's defaults set recipe fields (its data, prompt, rewards, evaluation); " \
                  "set it in the config"
        else:
            close = did_you_mean(key, fields)
            why = f"not a recipe field; did you mean `{close}`?" if close else "not a recipe field"
        problems.append(f"task: {name}'s defaults set '{key}', {why}")
    return unit, problems


def defaults(unit: Task | None, explicit: frozenset[str]) -> dict[str, Any]:
    """The task's defaults for the fields the config file and the flags left unset (`explicit`: those they set). The
    roles name the task's own rewards: a config that replaces the rewards keeps its own roles."""
    if unit is None:
        return {}
    return {k: v for k, v in unit.defaults.items()
            if k not in explicit and not (k in ROLE_FIELDS and "rewards" in explicit)}


def read_problems(recipe, unit: Task | None) -> list[str]:
    """A field that only a task implements, set for a run whose task does not read it: it would do nothing."""
    out = []
    for name in ("gold_check_tool",):
        if getattr(recipe, name) and name not in (unit.reads if unit is not None else ()):
            readers = [n for n, cls in available(recipe.task_dirs or ()).items() if name in cls.reads]
            current = f"task {recipe.task} does not read it" if recipe.task else "no task is set"
            out.append(f"{name}: {current}; the {', '.join(readers) or 'no'} task does. Fix: task: "
                       f"{readers[0] if readers else '...'}, or unset {name}")
    return out
