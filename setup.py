"""The package list, found rather than written by hand (pyproject.toml holds everything else): grpo_recipes with every
folder under it, and the folders a checkout keeps beside it that a wheel must carry inside it (grpo_recipes/bundled.py
finds them in either place): the shipped drop-ins (rewards/, tools/, tasks/), the recipes with their configs and data
(recipes/), and the Accelerate configs (accelerate_configs/). Never as top-level `rewards` or `recipes` packages."""

from setuptools import find_namespace_packages, setup

CARRIED = {"rewards": "bundled_rewards", "tools": "bundled_tools", "tasks": "bundled_tasks", "recipes": "bundled_recipes",
           "accelerate_configs": "bundled_accelerate_configs"}
SKIP = ["*__pycache__*", "*.egg-info*"]


def carried() -> dict[str, str]:
    """Package name -> folder, for each carried folder and every folder under it."""
    out = {}
    for folder, name in CARRIED.items():
        out[f"grpo_recipes.{name}"] = folder
        for sub in find_namespace_packages(folder, exclude=SKIP):
            out[f"grpo_recipes.{name}.{sub}"] = f"{folder}/{sub.replace('.', '/')}"
    return out


setup(
    packages=find_namespace_packages(include=["grpo_recipes", "grpo_recipes.*"], exclude=SKIP) + list(carried()),
    package_dir=carried(),
)
