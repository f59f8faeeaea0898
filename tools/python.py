"""python: run the model's program in grpo_recipes' sandbox (docs/sandbox.md) and hand back what it printed."""

from __future__ import annotations

from grpo_recipes import sandbox
from grpo_recipes.tools import ToolError, tool

MAX_OUTPUT_CHARS = 800  # the guard caps any result at 1000 characters; keep room for the error's last lines


def _traceback(stderr: str) -> str:
    # The model needs its error's last lines, not the whole stack.
    return stderr.strip()[-MAX_OUTPUT_CHARS:]


# The guard's timeout covers the sandbox's own deadline plus its start-up; the sandbox kills the program itself.
@tool(timeout_s=30)
def python(code: str, *, timeout_s: float = 5.0, memory_mb: int = 256) -> str:
    """Run a Python program and return what it prints (use print() to show results).

    Args:
        code: A complete Python program, e.g. "print(12 * (3 + 4))".
    """
    if not isinstance(code, str) or not code.strip():
        raise ToolError('code must be a non-empty Python program, e.g. "print(2 + 2)"')
    result = sandbox.run_program(code, timeout_s=timeout_s, memory_mb=memory_mb, output_cap=4 * MAX_OUTPUT_CHARS)
    out = result.stdout[-MAX_OUTPUT_CHARS:]
    if result.truncated:
        out += "\n[output cut]"
    if result.status == "timeout":
        raise ToolError(f"the program ran longer than {timeout_s:g}s and was stopped", kind="timeout")
    if result.status == "infra_error":
        raise ToolError(f"the sandbox failed: {result.detail}", kind="exception")
    if result.status in ("failed", "crashed"):  # a non-zero exit, with or without a traceback, or a signal
        why = _traceback(result.stderr) or f"the program exited with {result.detail or result.returncode}"
        raise ToolError((out + "\n" if out.strip() else "") + why, kind="program_error")
    return out.rstrip("\n") if out.strip() else "(the program printed nothing; use print() to show a result)"
