"""Tools: what a tool file (tools/*.py) imports. The registry, the guard every call runs behind and
discovery: registry.py; chat templates with tool calls: templates.py; reading an episode: episodes.py."""

from .registry import ToolError, environment, tool

__all__ = ["ToolError", "environment", "tool"]
