"""Fail-fast configuration: every bad config stops with a message naming the field and the fix, before any model loads.

Each case runs the recipe's real entry point, `runner.main`, in-process with the model loaders replaced by a tripwire:
if validation let the config through, main would go on to load the model and the test fails on the tripwire.
"""

import json
import sys
import time

import pytest
from helpers import REPO, fake_checkpoint, tiny_run_args

from grpo_recipes.errors import ConfigError
from grpo_recipes.run import runner
from grpo_recipes.state import checkpoint, models
from grpo_recipes.vllm import support as vllm_support

DEFAULT = REPO / "recipes/configs/math_cpu.yaml"
RECIPE = REPO / "recipes/math_grpo.py"


class ModelLoadAttempted(AssertionError):
    pass


@pytest.fixture
def no_model(monkeypatch, run_env):
    """Fail the test if anything tries to load a model."""

    def tripwire(*args, **kwargs):
        raise ModelLoadAttempted("validation let a bad config through to model loading")

    monkeypatch.setattr(models, "resolve_model", tripwire)
    monkeypatch.setattr(runner, "build_trainer", tripwire)
    import transformers

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", tripwire)
    # The vLLM case must not depend on whether this machine happens to have vLLM installed.
    monkeypatch.setattr(vllm_support, "vllm_installed", lambda: False)
    return run_env


def base_argv(out):
    """A small, valid configuration (40 training rows): only the case's own settings make it bad."""
    return ["--output_dir", str(out), "--train_size", "40", "--eval_size", "8"]


def _yaml(tmp, text):
    cfg = tmp / "recipe.yaml"
    cfg.write_text(DEFAULT.read_text() + "\n" + text + "\n")  # a repeated key: the last one wins
    return ["--config", str(cfg)]


def _with_checkpoint(tmp, complete=True):
    return fake_checkpoint(tmp / "out", 2, complete=complete)


def _reward_needing_a_column(tmp):
    rewards = tmp / "my_rewards"
    rewards.mkdir()
    (rewards / "needs_solution.py").write_text(
        "from grpo_recipes.rewards.registry import reward\n\n"
        "@reward('needs_solution')\n"
        "def needs_solution(completions, solution):\n"
        "    return [0.0 for _ in completions]\n"
    )
    return ["--reward_dirs", str(rewards), "--rewards", '[{"name": "needs_solution"}]']


# (id, setup(tmp) -> extra argv, expected substring). Every message names the field first.
BAD_CONFIGS = [
    ("yaml-type", lambda t: _yaml(t, 'learning_rate: "fast"'),
     "learning_rate: 'fast' is not a float (in the config file)"),
    ("cli-type", lambda t: ["--learning_rate", "fast"], "learning_rate: 'fast' is not a float (on the command line)"),
    ("yaml-unknown-key", lambda t: _yaml(t, "learnig_rate: 1.0e-5"),
     "learnig_rate: unknown field in the config file; did you mean `learning_rate`"),
    ("cli-unknown-flag", lambda t: ["--num_generation", "4"],
     "num_generation: unknown field in the command line; did you mean `num_generations`"),
    ("yaml-bare-no", lambda t: _yaml(t, "save_strategy: no"),
     "save_strategy: YAML read the value as the boolean false (in the config file); write it in quotes"),
    ("cli-bad-choice", lambda t: ["--save_strategy", "step"],
     "save_strategy: 'step' is not one of no, steps, epoch, best; did you mean 'steps'?"),
    ("cli-bad-bool", lambda t: ["--bf16", "maybe"], "bf16: 'maybe' is not true or false"),
    ("cli-missing-value", lambda t: ["--max_steps"], "max_steps: --max_steps needs one value, got no value"),
    ("yaml-int-field-float", lambda t: _yaml(t, "max_steps: 2.5"), "max_steps: 2.5 is not an integer"),
    ("batch-vs-generations", lambda t: ["--num_generations", "3"],
     "num_generations: the generation batch (per_device_train_batch_size 1 × 1 process ×"
     " gradient_accumulation_steps 16 = 16) is not a multiple of num_generations 3"),
    ("one-generation", lambda t: ["--num_generations", "1"], "num_generations: 1; GRPO needs at least 2"),
    ("generation-batch", lambda t: ["--generation_batch_size", "13", "--per_device_train_batch_size", "2"],
     "generation_batch_size: 13 is not a multiple of per_device_train_batch_size × processes = 2 × 1 = 2"),
    ("generation-both", lambda t: ["--generation_batch_size", "32", "--steps_per_generation", "2"],
     "generation_batch_size, steps_per_generation: both set"),
    ("trl-post-init", lambda t: ["--auto_find_batch_size", "true"], "auto_find_batch_size is not supported by GRPO"),
    ("loss-type", lambda t: ["--loss_type", "dapoo"],
     "loss_type: 'dapoo' is not one of grpo, bnpo, dr_grpo, dapo, luspo, cispo, sapo, vespo; did you mean 'dapo'?"),
    ("scale-rewards", lambda t: ["--scale_rewards", "groups"],
     "scale_rewards: 'groups' is not one of group, batch, none"),
    ("lr-zero", lambda t: ["--learning_rate", "0"], "learning_rate: 0; it must be > 0"),
    ("beta-negative", lambda t: ["--beta", "-0.1"], "beta: -0.1; the KL coefficient must be >= 0"),
    ("epsilon-range", lambda t: ["--epsilon", "1.5"], "epsilon: 1.5; the clip range (1-ε, 1+ε) needs 0 < epsilon < 1"),
    ("temperature", lambda t: ["--temperature", "0"], "temperature: 0; sampling needs a temperature > 0"),
    ("failure-rate", lambda t: ["--max_reward_failure_rate", "1.5"],
     "max_reward_failure_rate: 1.5; it is a fraction between 0 and 1"),
    ("output-dir-has-run", lambda t: [] if _with_checkpoint(t) else [],
     "already holds checkpoints of an earlier run (checkpoint-2); training into it would mix the two runs."
     " Fix: --resume"),
    ("resume-and-overwrite", lambda t: ["--resume", "--overwrite_output_dir"],
     "resume, overwrite_output_dir: both set"),
    ("resume-missing", lambda t: ["--resume_from_checkpoint", str(t / "nope")],
     "resume_from_checkpoint: no such folder"),
    ("resume-incomplete", lambda t: ["--resume_from_checkpoint", str(_with_checkpoint(t, complete=False))],
     "is not a complete checkpoint (no checkpoint_complete.json: the save did not finish"),
    ("vllm-missing", lambda t: ["--use_vllm", "true"], "use_vllm: true, but vLLM is not installed"),
    ("reward-column", _reward_needing_a_column,
     "rewards[0] (needs_solution): needs dataset column 'solution', which the dataset lacks"),
    ("trackio-group-no-trackio", lambda t: ["--trackio_group", "sweep", "--report_to", "none"],
     "trackio_group: 'sweep' groups Trackio runs, but report_to is none; add trackio"),
    ("too-few-prompts", lambda t: ["--train_size", "1"],
     "train_size: the dataset has 1 training rows, but one generation batch needs 2 distinct prompts"),
]


@pytest.mark.parametrize("case,setup,expected", BAD_CONFIGS, ids=[c[0] for c in BAD_CONFIGS])
def test_bad_config_stops_before_any_model_loads(case, setup, expected, no_model, capsys):
    extra = setup(no_model)
    rc = runner.main("math", DEFAULT, base_argv(no_model / "out") + extra)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert expected in err, err
    assert "Traceback" not in err


def test_every_problem_is_reported_at_once(no_model, capsys):
    _with_checkpoint(no_model)
    argv = _yaml(no_model, "learnig_rate: 1.0e-5\nbeta: -1") + [
        "--bf16", "maybe", "--save_strategy", "step", "--max_stepz", "3",
    ]
    assert runner.main("math", DEFAULT, base_argv(no_model / "out") + argv) == 2
    err = capsys.readouterr().err
    for expected in ("learnig_rate: unknown field", "bf16: 'maybe'", "save_strategy: 'step'", "max_stepz: unknown"):
        assert expected in err, err
    # the static stage runs even when the batch geometry is what keeps the dataclasses from being built
    argv = ["--num_generations", "3", "--beta", "-1", "--loss_type", "nope"]
    assert runner.main("math", DEFAULT, base_argv(no_model / "out") + argv) == 2
    err = capsys.readouterr().err
    for expected in ("num_generations: the generation batch", "beta: -1", "loss_type: 'nope'", "output_dir:"):
        assert expected in err, err


def test_unusual_but_legal_values_warn_and_go_on(no_model, caplog):
    argv = ["--learning_rate", "1e-3", "--beta", "0.9", "--epsilon", "0.6", "--epsilon_high", "0.3"]
    with caplog.at_level("WARNING", logger="grpo_recipes"):
        run = runner.prepare("math", base_argv(no_model / "out") + argv, DEFAULT)
    text = caplog.text
    assert run.training.learning_rate == 1e-3
    for expected in ("learning_rate: 0.001 is above 0.0001", "beta: 0.9 is above 0.5", "epsilon: 0.6 is above 0.5",
                     "epsilon_high: 0.3 is below epsilon 0.6"):
        assert expected in text, text


def test_world_size_enters_the_batch_check(no_model, monkeypatch):
    from grpo_recipes.config.batching import batch_problems

    values = {"num_generations": 8, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 1,
              "generation_batch_size": None, "steps_per_generation": None}
    [problem] = batch_problems(values, processes=1)
    assert "per_device_train_batch_size 4 × 1 process × gradient_accumulation_steps 1 = 4" in problem
    assert "set per_device_train_batch_size to 8" in problem
    assert batch_problems(values, processes=2) == []  # 4 × 2 processes = 8: whole groups
    assert batch_problems({**values, "gradient_accumulation_steps": 2}, processes=1) == []


def test_resume_with_valid_checkpoint_and_overwrite_pass_validation(no_model):
    path = _with_checkpoint(no_model)
    plan = runner.prepare("math", base_argv(no_model / "out") + ["--resume"], DEFAULT).start
    assert plan.resume_from == path and plan.start_step == 2
    plan = runner.prepare("math", base_argv(no_model / "out") + ["--overwrite_output_dir"], DEFAULT).start
    assert plan.discard == [path]
    with pytest.raises(ConfigError, match="already holds checkpoints"):
        runner.prepare("math", base_argv(no_model / "out"), DEFAULT)


SUBPROCESS_CASES = ["cli-type", "output-dir-has-run"]


@pytest.mark.parametrize("case", SUBPROCESS_CASES)
def test_bad_config_fails_fast_from_the_command_line(case, tiny_model_dir, run_env, record_property):
    """The real command, timed. Most of the time is `import torch, trl` (about 3.5 s on an idle laptop)."""
    import subprocess

    _, setup, expected = next(c for c in BAD_CONFIGS if c[0] == case)
    out = run_env / "out"
    argv = tiny_run_args(tiny_model_dir, out) + setup(run_env)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, str(RECIPE), *argv], capture_output=True, text=True, timeout=300,
                          cwd=run_env)
    seconds = time.monotonic() - started
    record_property("seconds", round(seconds, 2))
    print(json.dumps({"case": case, "seconds": round(seconds, 2)}))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert expected in proc.stderr
    assert "INFO grpo_recipes: model " not in proc.stderr  # build_trainer's first log line: never reached
    assert not any(out.glob("*.safetensors")) and not (out / checkpoint.RUN_INFO).exists()
