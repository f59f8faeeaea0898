"""grpo-recipes as a user gets it: built into a wheel and installed (not editable, no checkout around), the
`grpo-recipes eval --recipe NAME` command finds the recipe's config, its data files and the shipped rewards inside
the package (and the agent recipe its shipped tools and tool chat template). Offline: the wheel is built from a copy of the sources with this environment's setuptools."""

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import REPO

SOURCES = ("pyproject.toml", "README.md", "grpo_recipes", "rewards", "tools", "tasks", "recipes")


def run(argv, **kwargs):
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, **kwargs)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-4000:])
    return proc


def test_eval_runs_from_an_installed_wheel(tmp_path, tiny_model_dir):
    src, wheels, site, work = (tmp_path / d for d in ("src", "wheels", "site", "work"))
    src.mkdir()
    for name in SOURCES:  # a copy: building in the checkout would leave build/ and egg-info there
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(REPO / name, src / name)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w",
         str(wheels), str(src)])
    [wheel] = wheels.glob("grpo_recipes-*.whl")
    run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target", str(site), str(wheel)])
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "GRPO_RECIPES_REWARD_DIRS"}
    env.update(PYTHONPATH=str(site), HF_HUB_OFFLINE="1")
    where = run([sys.executable, "-c", "import grpo_recipes; print(grpo_recipes.__file__)"], cwd=work, env=env)
    assert where.stdout.strip() == str(site / "grpo_recipes" / "__init__.py")  # the wheel's copy, not the checkout
    # agent: the shipped tools (tools/ -> grpo_recipes/bundled_tools) and the chatml_tools template (package data)
    for recipe, correctness in (("math", "math_correctness"), ("json", "json_field_accuracy"), ("agent", "final_answer")):
        out = work / f"{recipe}.json"
        run([str(site / "bin" / "grpo-recipes"), "eval", "--recipe", recipe, "--model", str(tiny_model_dir),
             "--limit", "2", "--k", "1", "--output", str(out), "--", "--train_size", "20", "--eval_size", "4",
             "--max_completion_length", "4", "--report_to", "none"], cwd=work, env=env)
        report = json.loads(out.read_text())
        assert report["rows"] == 2 and report["correctness_reward"] == correctness, report
        assert (report["tool_call_rate"] is not None) == (recipe == "agent"), report


def test_pyproject_ranges_hold_here_and_agree_with_trl():
    """transformers and TRL: the installed versions are in pyproject's ranges, each range has an upper bound, the
    installed transformers has the `activation_checkpointing` training field every shipped config sets (the floor's
    reason), and the transformers floor is inside TRL's own transformers requirement."""
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    from importlib.metadata import requires, version

    from packaging.requirements import Requirement
    from transformers import TrainingArguments

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    deps = {r.name: r for r in map(Requirement, pyproject["project"]["dependencies"])}
    for name in ("transformers", "trl"):
        assert deps[name].specifier.contains(version(name)), (name, version(name), str(deps[name].specifier))
        assert any(s.operator == "<" for s in deps[name].specifier), f"{name}: no upper bound"
    assert "activation_checkpointing" in {f.name for f in dataclasses.fields(TrainingArguments)}
    floor = next(s.version for s in deps["transformers"].specifier if s.operator == ">=")
    trl_needs = [r for r in map(Requirement, requires("trl")) if r.name == "transformers" and r.marker is None]
    assert trl_needs and all(r.specifier.contains(floor) for r in trl_needs), trl_needs
