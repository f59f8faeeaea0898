"""Tasks: one file, found by name, holding a recipe's data source, prompt, demonstrations, rewards and held-out set.

The end-to-end test does what docs/tasks.md tells a user to do: a task the project does not ship (reasoning-gym's
spell_backward, its own prompt, demonstrations and verifier), one task file and one YAML copied into a temporary
folder, run from there offline with recipes/train.py: an sft stage, then GRPO."""

import json
import shutil
import sqlite3
import subprocess
import sys

import pytest
from helpers import REPO

from grpo_recipes.config.resolve import resolve
from grpo_recipes.errors import ConfigError
from grpo_recipes.run.runner import prepare
from grpo_recipes.tasks import registry as tasks

EXAMPLE = REPO / "tests" / "data" / "spell_task"
MATH = REPO / "recipes" / "configs" / "math_cpu.yaml"


def test_the_shipped_tasks_are_found_by_name():
    assert {"arithmetic", "code", "json_extraction"} <= set(tasks.available())


def test_a_task_file_in_task_dirs_brings_its_data_prompt_demonstrations_and_verifier(tmp_path):
    config = EXAMPLE / "spell_backward.yaml"  # in place: a second copy of the file would register its reward twice
    run = prepare("spell", ["--config", str(config), "--output_dir", str(tmp_path / "out"), "--report_to", "none"],
                  for_training=False)
    recipe = run.recipe
    assert recipe.gym_task == "spell_backward" and [s.name for s in recipe.reward_specs] == ["spelled_backward"]
    row = run.train[0]
    word = json.loads(row["gym_entry"])["metadata"]["word"]
    assert row["prompt"][-1]["content"].endswith("Answer as \\boxed{letters}.") and word in row["prompt"][-1]["content"]
    assert row["demonstration"].endswith(f"\\boxed{{{word[::-1]}}}")
    # The task's own verifier, from the same file: the demonstration earns it, a hedge of two boxes does not.
    [verifier] = run.funcs
    assert verifier([row["demonstration"], f"\\boxed{{{word[::-1]}}} or \\boxed{{{word}}}"],
                    answer=[row["answer"]] * 2) == [1.0, 0.0]
    assert not {q for q in run.train["question"]} & {q for q in run.held_out["question"]}


def test_the_config_overrides_a_task_default(tmp_path):
    argv = ["--config", str(EXAMPLE / "spell_backward.yaml"), "--output_dir", str(tmp_path / "out"),
            "--prompt_template", "{question}"]
    config = resolve(argv)
    recipe = config.recipe
    assert recipe.prompt_template == "{question}" and recipe.gym_task == "spell_backward"


@pytest.mark.parametrize("argv, message", [
    (["--task", "arithmetc"], "task: unknown task 'arithmetc'; did you mean 'arithmetic'?"),
    (["--task", "code", "--gold_check_tool", "calculator"],
     "gold_check_tool: task code does not read it; the arithmetic task does"),
])
def test_a_task_that_cannot_work_is_named_before_anything_loads(argv, message, tmp_path):
    with pytest.raises(ConfigError) as err:
        prepare("math", ["--output_dir", str(tmp_path / "out"), *argv], MATH)
    assert message in str(err.value)


def test_a_task_file_that_breaks_names_itself(tmp_path):
    (tmp_path / "broken.py").write_text("raise RuntimeError('no')\n")
    with pytest.raises(ConfigError, match="task_dirs: task file .*broken.py failed to import"):
        prepare("math", ["--output_dir", str(tmp_path / "out"), "--task_dirs", str(tmp_path)], MATH)


def test_a_new_task_runs_sft_then_grpo_from_its_own_folder(tiny_model_dir, run_env):
    folder = run_env / "my_task"
    shutil.copytree(EXAMPLE, folder)
    small = ["--model_name_or_path", str(tiny_model_dir), "--train_size", "24", "--eval_size", "4",
             "--stages", json.dumps([{"name": "sft", "max_steps": 1, "per_device_train_batch_size": 4},
                                     {"name": "grpo"}]),
             "--max_steps", "1", "--num_generations", "4", "--per_device_train_batch_size", "8",
             "--max_completion_length", "8", "--save_strategy", "no", "--trackio_dir", str(run_env / "trackio")]
    proc = subprocess.run([sys.executable, str(REPO / "recipes" / "train.py"), "--config", "spell_backward.yaml",
                           *small], capture_output=True, text=True, timeout=900, cwd=folder)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = folder / "outputs" / "spell_backward"
    assert (out / "stages" / "1-sft" / "model.safetensors").is_file() and (out / "model.safetensors").is_file()
    summary = json.loads((out / "eval_summary.json").read_text())
    assert [s["stage"] for s in summary["stages"]] == ["sft", "grpo"] and summary["rows"] == 4
    with sqlite3.connect(run_env / "trackio" / "grpo-recipes-spell_backward.db") as con:
        logs = [json.loads(m) for (m,) in con.execute("SELECT metrics FROM metrics ORDER BY id")]
    trained = [m for m in logs if "train/loss" in m]
    assert len(trained) == 2 and "train/rewards/spelled_backward/mean" in trained[1]


@pytest.mark.parametrize("default, message", [
    ("num_generations", "task: odd_num_generations's defaults set 'num_generations', a training setting: a task's "
                        "defaults set recipe fields (its data, prompt, rewards, evaluation); set it in the config"),
    ("prompt_templat", "task: odd_prompt_templat's defaults set 'prompt_templat', not a recipe field; did you mean "
                       "`prompt_template`?"),
])
def test_a_task_default_that_is_no_recipe_field_is_named_with_the_fix(default, message, tmp_path):
    (tmp_path / "odd.py").write_text(
        "from grpo_recipes.tasks import Task, task\n\n"
        f"@task('odd_{default}')\nclass Odd(Task):\n    defaults = {{'{default}': 4}}\n")
    with pytest.raises(ConfigError) as err:
        resolve(["--task", f"odd_{default}", "--task_dirs", str(tmp_path)], MATH)
    assert message in str(err.value)


def test_rewards_check_finds_a_task_files_reward_and_checks_it_on_the_tasks_rows(tmp_path, monkeypatch, capsys):
    """As docs/tasks.md says: from the folder with tasks/, `grpo-recipes rewards check NAME` needs no flag."""
    from grpo_recipes.cli import main

    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "gym_sum.py").write_text(
        "from grpo_recipes.rewards import reward\nfrom grpo_recipes.tasks import Task, task\n\n"
        "@reward('sum_answer_only')\ndef sum_answer_only(completions, answer, *, scale: float = 2.0):\n"
        "    return [scale * float(c.strip().endswith(str(a))) for c, a in zip(completions, answer)]\n\n"
        "@task('gym_sum')\nclass GymSum(Task):\n"
        "    defaults = {'gym_task': 'basic_arithmetic', 'rewards': [{'name': 'sum_answer_only', "
        "'params': {'scale': 1.0}}]}\n")
    monkeypatch.chdir(tmp_path)
    assert main(["rewards", "check", "sum_answer_only", "--rows", "3", "--no-fuzz"]) in (0, 1)
    out = capsys.readouterr().out
    assert "reward sum_answer_only  (tasks/gym_sum.py)" in out and 'params {"scale": 1.0}' in out  # the task's params
    assert main(["rewards", "check", "sum_answer_onyl"]) == 2
    err = capsys.readouterr().err
    assert "unknown reward 'sum_answer_onyl'" in err and "--task-dir add folders" in err
