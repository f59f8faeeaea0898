"""The agent recipe through the runner: start-up checks before any model loads, and the tiny model end to end
(an sft stage on tool trajectories, then GRPO with multi-turn rollouts, tool metrics in Trackio, held-out
episodes), in one command."""

import json
import os
import subprocess
import sys

import pandas as pd
import pytest
from helpers import REPO, tiny_run_args, trackio_metrics

from grpo_recipes.errors import ConfigError
from grpo_recipes.run import runner
from grpo_recipes.stages.grpo import GRPOStage, tool_kwargs

AGENT = REPO / "recipes/configs/agent_cpu.yaml"


def problems(*argv, config=AGENT, stage=GRPOStage) -> str:
    with pytest.raises(ConfigError) as exc:
        runner.prepare("agent", ["--output_dir", "/nonexistent/never-written", *argv], config, stage)
    return str(exc.value)


@pytest.mark.parametrize("argv, expected", [
    (["--tools", '[{"name": "calculater"}]'], "tools[0]: unknown tool 'calculater'; did you mean 'calculator'?"),
    (["--tools", '[{"name": "python", "params": {"timeout": 3}}]'],
     "tools[0].params.timeout: tool 'python' has no setting 'timeout'; it accepts: timeout_s, memory_mb"),
    (["--tools", '[{"name": "python", "params": {"memory_mb": "lots"}}]'],
     "tools[0].params.memory_mb: 'lots' is not an integer"),
    (["--tools", '["calculator", "calculator"]'], "tools: 'calculator' appears twice"),
    (["--tools", '[{"name": "calculator", "timeout_s": 3}]'], "tools[0]: unknown keys ['timeout_s']"),
    (["--tool_template", "chatml"], "tool_template: 'chatml' is not one of model, chatml_tools"),
    (["--environment", "sandbox_env"], "environment: unknown environment 'sandbox_env'"),
    (["--gold_check_tool", "abacus"], "gold_check_tool: unknown tool 'abacus'"),
])
def test_bad_tool_settings_fail_before_anything_loads(argv, expected):
    assert expected in problems(*argv)


def test_tool_trajectory_stage_needs_tools_and_assistant_only_loss():
    sft = {"name": "sft", "sft_format": "tool_trajectory", "assistant_only_loss": False, "max_steps": 1}
    text = problems("--tools", "[]", "--stages", json.dumps([sft, {"name": "grpo"}]), stage=None)
    assert "stages[0] (sft): sft_format: tool_trajectory renders a call to the first configured tool; set `tools`" in text
    assert "stages[0] (sft): assistant_only_loss: must be true with sft_format tool_trajectory" in text


def test_the_agent_recipe_runs_alone_its_first_stage_teaches_the_call_format():
    """No separate warm-up command: the default config starts from the base model with an sft stage of tool episodes."""
    run = runner.prepare("agent", ["--output_dir", "/nonexistent/never-written", "--train_size", "20",
                                   "--eval_size", "2"], AGENT)
    assert [s.name for s in run.stages] == ["sft", "grpo"]
    assert run.model_args.model_name_or_path == "HuggingFaceTB/SmolLM2-135M-Instruct"
    sft = run.stages[0].spec.training
    assert (sft.sft_format, sft.assistant_only_loss) == ("tool_trajectory", True)


def test_a_tool_file_that_breaks_names_itself(tmp_path):
    (tmp_path / "bad.py").write_text("from grpo_recipes.tools.registry import tool\n\n@tool\ndef nodoc(x: int) -> str:\n"
                                     "    return str(x)\n")
    assert "tool_dirs: tool file" in problems("--tool_dirs", str(tmp_path))


def test_model_without_tool_template_is_refused_with_the_fix(tiny_model_dir):
    """SmolLM2's own template cannot render tool calls: a config error naming tool_template's fix, raised from the
    tokenizer alone, before the trainer loads the weights (runner.main turns it into exit code 2)."""
    run = runner.prepare("agent", ["--output_dir", "/nonexistent/never-written", "--tool_template", "model",
                                   "--train_size", "20", "--eval_size", "2"], AGENT)
    with pytest.raises(ConfigError) as exc:
        tool_kwargs(run.recipe, str(tiny_model_dir))
    assert "the model's chat template cannot render tool calls" in str(exc.value)
    assert "Set tool_template to one of: chatml_tools" in str(exc.value)
    kwargs = tool_kwargs(runner.prepare("agent", ["--output_dir", "/nonexistent/never-written", "--train_size",
                                                         "20", "--eval_size", "2"], AGENT).recipe, str(tiny_model_dir))
    assert [t.__name__ for t in kwargs["tools"]] == ["calculator"] and kwargs["environment_factory"] is None
    assert "<tool_call>" in kwargs["processing_class"].chat_template


def test_grpo_on_the_tiny_model_logs_tool_metrics_and_evaluates_episodes(tiny_model_dir, run_env):
    out = run_env / "out"
    args = tiny_run_args(tiny_model_dir, out, 1, "--max_completion_length", "24", "--eval_size", "4", "--eval_k", "0")
    proc = subprocess.run([sys.executable, str(REPO / "recipes/agent_grpo.py"), *args],
                          capture_output=True, text=True, timeout=600, cwd=run_env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = [json.loads(m) for _, m in trackio_metrics(run_env / "trackio", "grpo-recipes-agent")]
    [train] = [r for r in records if "train/loss" in r]
    for key in ("tools/call_rate", "tools/calls_per_episode", "tools/unfinished_rate", "rewards/final_answer/mean",
                "rewards/tool_grounded/mean"):
        assert 0.0 <= train[f"train/{key}"] <= 1.0, key
    assert train["train/tools/turns_per_episode"] >= 1.0
    assert len([r for r in records if "eval/tool_call_rate" in r]) == 2  # start and end: multi-turn episodes
    summary = json.loads((out / "eval_summary.json").read_text())
    assert summary["rows"] == 4 and summary["end"]["tool_call_rate"] is not None


@pytest.mark.slow
def test_sft_then_grpo_on_the_tiny_model(tiny_model_dir, run_env):
    out = run_env / "out"
    sft = {"name": "sft", "sft_format": "tool_trajectory", "assistant_only_loss": True, "max_steps": 1,
           "per_device_train_batch_size": 4, "max_length": 512}
    args = tiny_run_args(tiny_model_dir, out, 2, "--max_completion_length", "48", "--eval_k", "2",
                         "--stages", json.dumps([sft, {"name": "grpo"}]))
    proc = subprocess.run([sys.executable, str(REPO / "recipes/agent_grpo.py"), *args],
                          capture_output=True, text=True, timeout=900, cwd=run_env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = [json.loads(m) for _, m in trackio_metrics(run_env / "trackio", "grpo-recipes-agent")]
    train = [r for r in records if "train/loss" in r]
    assert len(train) == 3 and "train/tools/call_rate" not in train[0]  # the sft step, then two GRPO steps
    for key in ("tools/call_rate", "tools/calls_per_episode", "tools/turns_per_episode", "tools/unfinished_rate",
                "rewards/final_answer/mean", "rewards/tool_grounded/mean"):
        assert 0.0 <= train[1][f"train/{key}"], key
    assert train[1]["train/tools/turns_per_episode"] >= 1.0
    evals = [r for r in records if "eval/tool_call_rate" in r]
    assert len(evals) == 3  # the start, the end of the sft stage and the end: multi-turn held-out episodes
    summary = json.loads((out / "eval_summary.json").read_text())
    assert summary["end"]["tool_call_rate"] is not None and summary["rows"] == 8
    assert summary["end"]["pass_at_k"] is not None  # eval_k 2: sampled multi-turn episodes too
    completions = [json.loads(line) for line in (out / "eval_completions.jsonl").read_text().splitlines()]
    assert len(completions) == 8 and all(isinstance(c["end"]["completion"], str) for c in completions)
    tables = sorted((out / "completions").glob("*.parquet"))
    assert tables
    df = pd.read_parquet(tables[-1])
    assert "episode" in df.columns and isinstance(df["completion"][0][0], dict)  # whole conversations


def test_tool_trajectory_uses_the_tools_real_result_and_drops_disagreeing_rows():
    from grpo_recipes.stages.sft import tool_trajectory
    from grpo_recipes.tools.registry import available, build_tools

    calc = build_tools(["calculator"], available())[0]
    row = {"question": "Calculate 95 - 21 / 21.", "answer": "94", "expression": "95 - 21 / 21"}  # task: arithmetic's
    call, result, final = tool_trajectory(row, calc)
    assert call["tool_calls"][0]["function"] == {"name": "calculator", "arguments": {"expression": "95 - 21 / 21"}}
    assert result == {"role": "tool", "name": "calculator", "content": "94"}
    assert final["content"] == "The answer is \\boxed{94}."
    # reasoning-gym floors this division (79/7 is not 11): a gold episode would teach a made-up tool result
    floored = {"question": "q", "answer": "11", "expression": "79 / -( -48 / 12 + -3 )"}
    assert tool_trajectory(floored, calc) is None
    assert tool_trajectory({"question": "q", "answer": "3"}, calc) is None  # no expression


def test_gold_check_drops_rows_the_tool_disagrees_with():
    from grpo_recipes.config.schema import RecipeArguments
    from grpo_recipes.tasks.registry import available

    rows = [{"question": "a", "answer": "94", "expression": "95 - 21 / 21"},
            {"question": "b", "answer": "11", "expression": "79 / -( -48 / 12 + -3 )"},
            {"question": "c", "answer": "5"}]
    arithmetic = available()["arithmetic"]()  # tasks/arithmetic.py reads gold_check_tool

    def kept(recipe):
        return [r["question"] for r in (arithmetic.prepare(r, recipe) for r in rows) if r is not None]

    assert kept(RecipeArguments(gold_check_tool="calculator")) == ["a"]
    assert kept(RecipeArguments()) == ["a", "b", "c"]


COUNTER = '''
from grpo_recipes.tools import environment


@environment("counter_e2e")
class Counter:
    def __init__(self, start: int = 0):
        self.start = start

    def reset(self, **row):
        self.total, self.goal = self.start, int(row["answer"])
        return "Use add to reach the answer."

    def add(self, n: int) -> str:
        """Add n to the running total.

        Args:
            n: The number to add.
        """
        self.total += n
        return str(self.total)

    def get_reward(self) -> float:
        return float(self.total == self.goal)
'''


def test_an_environment_from_a_tool_file_trains_through_trls_environment_factory(tiny_model_dir, run_env):
    """A drop-in environment: found by name, params bound, probed by TRL (its methods become the tools), reset per
    rollout with the row's columns, its get_reward added as a reward; the step completes with tool metrics."""
    folder = run_env / "envs"
    folder.mkdir()
    (folder / "counter.py").write_text(COUNTER)
    out = run_env / "out"
    args = tiny_run_args(tiny_model_dir, out, 1, "--max_completion_length", "16", "--tools", "[]", "--environment",
                         '{"name": "counter_e2e", "params": {"start": 1}}', "--tool_dirs", str(folder),
                         "--eval_heldout", "false")
    proc = subprocess.run([sys.executable, str(REPO / "recipes/agent_grpo.py"), *args], capture_output=True,
                          text=True, timeout=600, cwd=run_env, env={**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = [json.loads(m) for _, m in trackio_metrics(run_env / "trackio", "grpo-recipes-agent")]
    [train] = [r for r in records if "train/loss" in r]
    assert "train/rewards/Counter/mean" in train  # TRL named the environment's reward after the class
    assert "train/tools/call_rate" in train


def test_environment_params_and_method_clashes_are_start_up_errors(tmp_path):
    (tmp_path / "counter.py").write_text(COUNTER)
    text = problems("--tools", '["calculator"]', "--environment", '{"name": "counter_e2e", "params": {"stat": 1}}',
                    "--tool_dirs", str(tmp_path), "--eval_heldout", "false")
    assert "environment.params: got an unexpected keyword argument 'stat'" in text
    assert "environment: the held-out evaluation" not in text
    (tmp_path / "clash.py").write_text(COUNTER.replace("counter_e2e", "clash_e2e").replace("def add", "def calculator")
                                       .replace("Add n to", "Add n to it:"))
    text = problems("--tools", '["calculator"]', "--environment", "clash_e2e", "--tool_dirs", str(tmp_path))
    assert "tools: 'calculator' is also a method of environment 'clash_e2e'" in text
    assert "environment: the held-out evaluation runs standalone tools only" in text
