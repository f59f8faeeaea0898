"""Where the files shipped with grpo-recipes are (the rewards, tools and tasks, the recipes with their configs and
data, the Accelerate configs), and how a drop-in folder is searched and loaded (`DropIns`: rewards, tools and tasks
alike).

In a checkout (and an editable install) they are the repository's rewards/, tools/, tasks/, recipes/ and
accelerate_configs/ folders. A wheel carries copies inside the package, grpo_recipes/bundled_* (setup.py), because the
repository is not there after `pip install grpo-recipes`. A leaf: it imports nothing from the package.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def _shipped(installed: str, checkout: str) -> Path:
    inside = PACKAGE / installed
    return inside if inside.is_dir() else PACKAGE.parent / checkout


def recipes_dir() -> Path:
    """The shipped recipes folder: configs/*.yaml, and data/ that the configs name relative to themselves."""
    return _shipped("bundled_recipes", "recipes")


def accelerate_configs_dir() -> Path:
    """The shipped Accelerate configs (accelerate_configs/*.yaml)."""
    return _shipped("bundled_accelerate_configs", "accelerate_configs")


def accelerate_config(value: str) -> Path:
    """An --accelerate-config value: a file (a path with a folder or a suffix), or the name of a shipped config
    (`cpu_ddp`: accelerate_configs/cpu_ddp.yaml), which works from an installed wheel too."""
    path = Path(value)
    if path.suffix or len(path.parts) > 1:
        return path
    return accelerate_configs_dir() / f"{value}.yaml"


def accelerate_config_names() -> list[str]:
    return sorted(p.stem for p in accelerate_configs_dir().glob("*.yaml"))


def recipe_script(recipe: str) -> Path:
    """A shipped recipe's script by name (`math`: recipes/math_grpo.py), for `grpo-recipes launch`."""
    return recipes_dir() / f"{recipe}_grpo.py"


def recipe_config(recipe: str) -> Path:
    """A recipe's default CPU config, e.g. recipes/configs/math_cpu.yaml for `math`."""
    return recipes_dir() / "configs" / f"{recipe}_cpu.yaml"


def recipe_names() -> list[str]:
    """The GRPO recipes that have a default CPU config (`<name>_cpu.yaml`), e.g. ["agent", "code", "json", "math"].
    The SFT warm-up's configs (sft_*_cpu.yaml, for recipes/sft_warmup.py) and the distill configs (distill_*_cpu.yaml,
    for recipes/train.py) are not recipes of their own and are left out."""
    names = (p.name.removesuffix("_cpu.yaml") for p in (recipes_dir() / "configs").glob("*_cpu.yaml"))
    return sorted(n for n in names if not n.startswith(("sft_", "distill_")))


# ------------------------------------------------------------------------------------------------ drop-in folders


@dataclass(frozen=True)
class DropIns:
    """One kind of drop-in file: where its files are searched, in order (the config's folders, those in `env_var`,
    ./`local` where the process runs, the shipped ones), and under which private module prefix they load: no
    top-level `rewards`, `tools` or `tasks` package is ever imported."""

    kind: str  # names a file in errors: "reward file ... failed to import"
    env_var: str
    local: str
    shipped: str  # the folder's name inside a wheel (bundled_rewards); a checkout's is `local`
    prefix: str

    def dirs(self, extra: Iterable[str | os.PathLike] = ()) -> list[Path]:
        """The existing folders, each once, in search order."""
        env = [p for p in os.environ.get(self.env_var, "").split(os.pathsep) if p]
        candidates = [*extra, *env, Path.cwd() / self.local, _shipped(self.shipped, self.local)]
        seen, out = set(), []
        for c in candidates:
            path = Path(c).expanduser().resolve()
            if path.is_dir() and path not in seen:
                seen.add(path)
                out.append(path)
        return out

    def load(self, extra: Iterable[str | os.PathLike] = ()) -> None:
        """Import every `*.py` file of the folders (not `_*.py`) by path, once: the files register themselves
        through their decorators."""
        for folder in self.dirs(extra):
            for file in sorted(folder.glob("*.py")):
                if file.name.startswith("_"):
                    continue
                module_name = f"{self.prefix}.{abs(hash(str(file))):x}_{file.stem}"
                if module_name in sys.modules:
                    continue
                spec = importlib.util.spec_from_file_location(module_name, file)
                module = importlib.util.module_from_spec(spec)
                sys.modules[module_name] = module
                try:
                    spec.loader.exec_module(module)
                except Exception as exc:
                    del sys.modules[module_name]
                    hint = ""
                    if isinstance(exc, ModuleNotFoundError) and (exc.name or "").startswith("grpo_recipes."):
                        hint = (" (a drop-in file imports its decorator from grpo_recipes.rewards, grpo_recipes.tools "
                                "or grpo_recipes.tasks)")
                    raise ImportError(f"{self.kind} file {file} failed to import: {type(exc).__name__}: {exc}{hint}") \
                        from exc


REWARDS = DropIns("reward", "GRPO_RECIPES_REWARD_DIRS", "rewards", "bundled_rewards", "grpo_recipes._loaded_rewards")
TOOLS = DropIns("tool", "GRPO_RECIPES_TOOL_DIRS", "tools", "bundled_tools", "grpo_recipes._loaded_tools")
TASKS = DropIns("task", "GRPO_RECIPES_TASK_DIRS", "tasks", "bundled_tasks", "grpo_recipes._loaded_tasks")
