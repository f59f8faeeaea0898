"""`--help` works for every recipe: argparse %-formats each help string, so a lone `%` in a field's help (e.g.
"20% of episodes") crashed `python recipes/X.py --help` with `TypeError: %o format: an integer is required`."""

import dataclasses
import inspect
import os
import re
import subprocess
import sys

import pytest
from helpers import REPO
from trl import GRPOConfig, ModelConfig, SFTConfig, TrlParser

from grpo_recipes.config import schema as recipe_config
from grpo_recipes.config.schema import RecipeArguments

RECIPES = sorted(p.name for p in (REPO / "recipes").glob("*.py"))

# The project's own config dataclasses (RecipeArguments, the SFT stage's SFTConfig subclass, ...), found by looking,
# so that a renamed or added one is covered too.
OWN_DATACLASSES = [
    obj for _, obj in inspect.getmembers(recipe_config, inspect.isclass)
    if dataclasses.is_dataclass(obj) and obj.__module__ == recipe_config.__name__
]
TRAINING_CLASSES = [GRPOConfig] + [c for c in OWN_DATACLASSES if issubclass(c, SFTConfig)]

# What argparse accepts in a help string besides text: `%%` and `%(name)s`-style references to the action.
_ALLOWED_PERCENT = re.compile(r"%%|%\([a-z_]+\)[sdr]")


def _flat(text: str) -> str:
    return " ".join(text.split())  # argparse wraps help text at the terminal width


def test_recipes_found():
    assert "math_grpo.py" in RECIPES and len(RECIPES) >= 2
    assert RecipeArguments in OWN_DATACLASSES and len(TRAINING_CLASSES) >= 2  # GRPO and the SFT warm-up


@pytest.mark.parametrize("cls", OWN_DATACLASSES, ids=lambda c: c.__name__)
def test_own_help_strings_have_no_lone_percent(cls):
    """A `%` that format_help tolerates can still garble the text ("50% s" formats the action dict)."""
    bad = {f.name: f.metadata["help"] for f in dataclasses.fields(cls)
           if "%" in _ALLOWED_PERCENT.sub("", f.metadata.get("help", ""))}
    assert not bad, f"write `percent` or `%%` in these help strings: {bad}"


@pytest.mark.parametrize("training_cls", TRAINING_CLASSES, ids=lambda c: c.__name__)
def test_parser_formats_help(training_cls):
    """The parser the recipes build (parsing.py: TrlParser over RecipeArguments, the training config, ModelConfig)
    formats its help in-process: a bad `%` fails here without starting a subprocess."""
    parser = TrlParser((RecipeArguments, training_cls, ModelConfig), allow_abbrev=False)
    text = _flat(parser.format_help())
    assert "--learning_rate" in text and "--reward_dirs" in text
    for f in dataclasses.fields(RecipeArguments):
        if f.metadata.get("help"):
            assert f"--{f.name}" in text
    assert _flat(_help_of("alert_tool_result_used_min")) in text


def _help_of(name: str) -> str:
    return next(f.metadata["help"] for f in dataclasses.fields(RecipeArguments) if f.name == name)


# Each one a subprocess that imports torch and TRL: the default suite runs the math recipe's, CI's e2e step them all.
@pytest.mark.parametrize("recipe", [pytest.param(r, marks=() if r == "math_grpo.py" else pytest.mark.e2e)
                                    for r in RECIPES])
def test_recipe_help(recipe):
    """`python recipes/X.py --help` exits 0 and lists the training and recipe flags with their help text
    (about 6 s per recipe on a 2-core machine, most of it importing torch and TRL)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, f"recipes/{recipe}", "--help"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    text = _flat(proc.stdout)
    assert "--learning_rate" in text and "--reward_dirs" in text
    assert _flat(_help_of("reward_dirs")) in text
    assert _flat(_help_of("alert_tool_result_used_min")) in text


def test_eval_help_names_every_recipe(capsys):
    """`grpo-recipes eval --help` lists every recipe that `--recipe` accepts: one per shipped `<name>_cpu.yaml`, the
    same set as the recipes/<name>_grpo.py scripts."""
    from grpo_recipes import bundled
    from grpo_recipes.cli import main

    names = bundled.recipe_names()
    assert names == sorted(p.name.removesuffix("_grpo.py") for p in (REPO / "recipes").glob("*_grpo.py"))
    assert {"math", "agent"} <= set(names) and all(bundled.recipe_config(n).is_file() for n in names)
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--help"])
    assert exit_info.value.code == 0
    text = _flat(capsys.readouterr().out)
    assert f"--recipe RECIPE recipe name: {', '.join(names)} " in text


def test_train_runs_a_shipped_recipe_by_name_or_any_config(monkeypatch, capsys):
    """`grpo-recipes train` is what the recipe scripts do: a shipped recipe by name with its default config, or any
    config named after its task; every other argument reaches the recipe; --help lists the recipe's fields."""
    from grpo_recipes import bundled
    from grpo_recipes.cli import main, train

    calls = []
    monkeypatch.setattr(train, "main", lambda name, default_config=None, argv=None: calls.append(
        (name, default_config, argv)) or 0)
    assert main(["train", "--recipe", "json", "--max_steps", "3"]) == 0
    assert main(["train", "--config", "my.yaml", "--seed", "1"]) == 0
    assert main(["train"]) == 0
    assert calls == [("json", bundled.recipe_config("json"), ["--max_steps", "3"]),
                     (None, None, ["--config", "my.yaml", "--seed", "1"]),
                     ("math", bundled.recipe_config("math"), [])]
    assert main(["train", "--recipe", "jsno"]) == 2 and "not a shipped recipe (agent, code, json, math)" in \
        capsys.readouterr().err
    monkeypatch.undo()
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--recipe", "json", "--help"])
    assert exit_info.value.code == 0
    text = _flat(capsys.readouterr().out)
    assert "grpo-recipes train --recipe json --max_steps 20" in text and "--learning_rate" in text
