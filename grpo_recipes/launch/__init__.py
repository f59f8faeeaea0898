"""Launching: the vLLM server and the trainer on the right GPUs and nodes, from one layout (docs/scaling.md).

- layout.py: `Layout` (what to lay out) and `LaunchPlan` / `Proc` (the commands it becomes);
- plan.py: `plan(layout)`, one planner per mode; no side effects beyond reading two YAML files, so every layout is
  testable without GPUs (`grpo-recipes launch --dry-run` prints the plan);
- execute.py: `execute(plan)`, running and supervising the processes.
The command line is cli/launch.py.
"""

from .execute import execute, wait_ready
from .layout import LaunchPlan, Layout, Proc
from .plan import plan, resolve_gpu_ids

__all__ = ["Layout", "LaunchPlan", "Proc", "execute", "plan", "resolve_gpu_ids", "wait_ready"]
