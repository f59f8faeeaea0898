"""Tasks: what a task file (tasks/*.py) imports. The Task interface and discovery: registry.py; a task's
rows to train / held-out splits: data.py; the shipped tasks' data: code_rows.py, json_rows.py,
humaneval.py."""

from .registry import Task, task

__all__ = ["Task", "task"]
