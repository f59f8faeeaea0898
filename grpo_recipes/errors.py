"""Every error type grpo_recipes raises on purpose. A leaf: it imports nothing from the package.

Each message names the field, flag or file at fault and the fix; the entry points print it without a traceback.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """Every problem found at start-up, reported together."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("invalid configuration:\n" + "\n".join(f"  - {p}" for p in self.problems))


class ModelNotFound(RuntimeError):
    """model_name_or_path names nothing this machine can load: not a folder, not cached, Hub unreachable."""


class RewardContractError(RuntimeError):
    """The reward broke its contract for the whole batch (wrong length or type): a bug to fix, not a fault to skip."""


class RewardFailureRateExceeded(RuntimeError):
    """A reward raised on more than max_reward_failure_rate of its recent completions: the run stops."""


class LaunchError(ValueError):
    """A layout that cannot work. The message names the flag or field and the fix."""


class LaunchFailure(RuntimeError):
    """A process of a valid plan failed (server died, never got ready, interrupted)."""


class WeightSyncError(RuntimeError):
    """The trained weights could not be put into vLLM (vllm_cpu_sync.py). Training stops: generating with stale
    weights would silently train off-policy. `status`: the vLLM server's HTTP status, None when it was unreachable."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status
