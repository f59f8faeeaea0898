"""The reward registry: discovery of drop-in files, start-up checks, and the TRL-facing wrapper."""

import json
import subprocess
import sys
import textwrap

import pytest
from helpers import REPO

from grpo_recipes import bundled
from grpo_recipes.rewards import registry
from grpo_recipes.rewards.registry import CompiledReward, RewardContractError, RewardSpec
from grpo_recipes.values import Range


def write_reward(folder, name, body):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return path


def test_shipped_rewards_are_found_with_their_contract():
    known = registry.available()
    mc = known["math_correctness"]
    assert mc.columns == ("answer",)
    assert "timeout_s" in mc.params and "log_metric" in mc.context
    assert mc.doc  # `rewards list` shows it


def test_drop_in_file_is_usable_by_name_from_yaml_with_weight(tmp_path, tiny_model_dir, run_env):
    """A file added under rewards/ (here: the cwd's rewards/) is picked up by name, weight and params."""
    write_reward(run_env / "rewards", "shout", '''
        from grpo_recipes.rewards import reward

        @reward("shout_reward")
        def shout_reward(completions, *, bonus: float = 0.5):
            """Scores upper-case letters."""
            return [bonus + sum(c.isupper() for c in t) / max(len(t), 1) for t in completions]
    ''')
    config = run_env / "cfg.yaml"
    config.write_text((REPO / "recipes/configs/math_cpu.yaml").read_text().split("rewards:")[0] + textwrap.dedent("""
        rewards:
          - {name: math_correctness, weight: 1.0}
          - {name: shout_reward, weight: 0.25, params: {bonus: 2.0}}
    """))
    from helpers import tiny_run_args
    out = run_env / "out"
    cmd = [sys.executable, str(REPO / "recipes/math_grpo.py"), "--config", str(config),
           *tiny_run_args(tiny_model_dir, out, 1), "--report_to", "none"]
    proc = subprocess.run(cmd, cwd=run_env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rewards/shout_reward/mean" in proc.stdout + proc.stderr
    # bonus 2.0 from YAML reached the function: the mean is at least 2
    line = next(l for l in (proc.stdout + proc.stderr).splitlines() if "rewards/shout_reward/mean" in l)
    mean = float(line.split("'rewards/shout_reward/mean': '")[1].split("'")[0])
    assert mean >= 2.0


def test_reward_dirs_env_and_launch_from_elsewhere(tmp_path, monkeypatch):
    folder = tmp_path / "my_rewards"
    write_reward(folder, "envfound", '''
        from grpo_recipes.rewards import reward

        @reward("env_found")
        def env_found(completions, answer):
            return [1.0 for _ in completions]
    ''')
    monkeypatch.setenv(bundled.REWARDS.env_var, str(folder))
    monkeypatch.chdir(tmp_path)  # not the repo root: the shipped rewards must still be found
    known = registry.available()
    assert "env_found" in known and "math_correctness" in known
    assert known["env_found"].columns == ("answer",)


def test_no_top_level_rewards_package_is_imported():
    registry.available()
    assert "rewards" not in sys.modules
    assert not any(name.startswith("rewards.") for name in sys.modules)


def test_duplicate_name_in_two_files_is_an_error(tmp_path, monkeypatch):
    for stem in ("a", "b"):
        write_reward(tmp_path / "dups", stem, f'''
            from grpo_recipes.rewards import reward

            @reward("twice_defined")
            def f_{stem}(completions):
                return [0.0 for _ in completions]
        ''')
    with pytest.raises(ImportError, match="defined twice"):
        registry.available([tmp_path / "dups"])


def test_contract_checks_name_the_problem_and_the_fix():
    known = registry.available()
    specs = [RewardSpec.parse("nope", 0), RewardSpec.parse({"name": "think_format", "params": {"strictt": True}}, 1),
             RewardSpec.parse({"name": "math_correctness"}, 2)]
    problems = registry.check_specs(specs, known, columns=["prompt", "question"])
    assert any("unknown reward 'nope'" in p and "math_correctness" in p for p in problems)
    assert any("params.strictt" in p and "strict" in p for p in problems)
    assert any("needs dataset column 'answer'" in p for p in problems)
    with pytest.raises(ValueError, match=r"rewards\[0\].weight"):
        RewardSpec.parse({"name": "x", "weight": "heavy"}, 0)
    with pytest.raises(ValueError, match=r"unknown keys \['wieght'\]"):
        RewardSpec.parse({"name": "x", "wieght": 1}, 0)


def test_signature_must_name_its_inputs():
    with pytest.raises(TypeError, match="first parameter must be `completions`"):
        registry._describe(lambda texts: [], "bad", "here")
    with pytest.raises(TypeError, match=r"\*\*kwargs hide the contract"):
        registry._describe(lambda completions, **kw: [], "bad", "here")


def _compiled(func, **params):
    rdef = registry._describe(func, "t", "test")
    faults = []
    return CompiledReward(rdef, RewardSpec("t", 1.0, params), fault_log=faults.append), faults


def test_compiled_reward_reads_chat_completions_and_columns():
    def scorer(completions, answer, *, scale: float = 1.0):
        return [scale * float(t.strip() == a) for t, a in zip(completions, answer)]

    fn, _ = _compiled(scorer, scale=2.0)
    out = fn([[{"role": "assistant", "content": "4"}], [{"role": "assistant", "content": "5"}]], answer=["4", "4"],
             prompts=[[], []], trainer_state=None)
    assert out == [2.0, 0.0]


def test_a_reward_that_raises_on_one_completion_gives_none_for_it_only():
    def fragile(completions):
        return [1.0 / len(t) for t in completions]  # ZeroDivisionError on ""

    fn, faults = _compiled(fragile)
    metrics = {}
    out = fn(["ab", "", "abcd"], log_metric=lambda k, v: metrics.__setitem__(k, v))
    assert out == [0.5, None, 0.25]
    assert fn.error_count == 1 and len(faults) == 1 and faults[0]["completion"] == ""
    assert metrics["rewards/t/none_rate"] == pytest.approx(1 / 3)


def test_completion_messages_are_the_message_lists_and_are_cut_per_completion_on_a_fault():
    # A tool run's completions are message lists; `completions` is their text (tool results included), the
    # `completion_messages` context name the lists themselves. When the batch raises, each completion is retried
    # alone with ITS OWN messages (not the whole batch's, which would fail every retry).
    def by_turns(completions, completion_messages):
        return [1.0 / (len(m) - 1) for m in completion_messages]  # ZeroDivisionError on a one-message episode

    fn, faults = _compiled(by_turns)
    episode = [{"role": "assistant", "content": "", "tool_calls": []}, {"role": "tool", "content": "94"},
               {"role": "assistant", "content": "\\boxed{94}"}]
    out = fn([episode, [{"role": "assistant", "content": "x"}], episode[:2]], trainer_state=None)
    assert out == [0.5, None, 1.0] and len(faults) == 1


def test_contract_violations_are_bugs_not_faults():
    fn, _ = _compiled(lambda completions: [1.0])
    with pytest.raises(RewardContractError, match="returned 1 values for 2 completions"):
        fn(["a", "b"])
    fn, _ = _compiled(lambda completions: ["high" for _ in completions])
    with pytest.raises(RewardContractError, match="expected float or None"):
        fn(["a"])


def test_format_role_picks_the_default_format_reward():
    known = registry.available()
    assert known["boxed_format"].role == "format" and known["math_correctness"].role is None
    specs = lambda *names: [RewardSpec(n) for n in names]  # noqa: E731
    pick = registry.default_format_reward
    assert pick(specs("math_correctness", "boxed_format"), known, "math_correctness") == "boxed_format"
    assert pick(specs("math_correctness"), known, "math_correctness") is None
    # Two format rewards: no single one to name, so none is picked (the alert then watches both).
    assert pick(specs("math_correctness", "boxed_format", "think_format"), known, "math_correctness") is None
    # A format reward that is the correctness reward is never also the format reward.
    assert pick(specs("boxed_format"), known, "boxed_format") is None
    assert pick([RewardSpec("boxed_format", alias="box")], known, "math_correctness") == "box"
    with pytest.raises(ValueError, match="role must be one of"):
        registry.reward("x", role="style")


def test_default_recipes_resolve_their_format_and_correctness_rewards(run_env, monkeypatch):
    from grpo_recipes.run.runner import prepare

    monkeypatch.chdir(run_env)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for name, correctness, fmt in (("math", "math_correctness", "boxed_format"),
                                   ("json", "json_field_accuracy", "json_schema")):
        config = REPO / "recipes" / "configs" / f"{name}_cpu.yaml"
        recipe = prepare(name, ["--config", str(config), "--train_size", "20", "--eval_size", "4",
                                "--report_to", "none"]).recipe
        assert (recipe.correctness_reward or recipe.reward_specs[0].metric_name, recipe.format_reward) == (correctness, fmt)
    # An explicit setting wins, and a rewards list without a format reward leaves it unset.
    recipe = prepare("math", ["--config", str(REPO / "recipes/configs/math_cpu.yaml"), "--report_to", "none",
                              "--rewards", '[{"name": "math_correctness"}]', "--train_size", "20", "--eval_size", "4"]).recipe
    assert recipe.format_reward is None


# ------------------------------------------------------------------------------------- parameter values


def _problems(name: str, params: dict) -> list[str]:
    spec = RewardSpec.parse({"name": name, "params": params}, 0)
    return registry.check_specs([spec], registry.available(), columns=None)


def test_param_values_must_fit_the_annotations_of_the_signature():
    assert _problems("math_correctness", {"answer_form": "expression", "timeout_s": 5, "require_boxed": False}) == []
    assert _problems("math_correctness", {"answer_form": "literall", "timeout_s": -1, "require_boxed": "yes"}) == [
        "rewards[0] (math_correctness).params.answer_form: 'literall' is not one of 'literal', 'expression'; "
        "did you mean 'literal'?",
        "rewards[0] (math_correctness).params.timeout_s: -1 is not a number > 0",
        "rewards[0] (math_correctness).params.require_boxed: 'yes' is not true or false",
    ]
    [problem] = _problems("think_format_if_correct", {"timeout_s": "1e-3"})
    assert problem.startswith("rewards[0] (think_format_if_correct).params.timeout_s: '1e-3' is not a number > 0; "
                              "it is text: write the number unquoted")
    assert _problems("numeric_match", {"rel_tol": -0.1}) == [
        "rewards[0] (numeric_match).params.rel_tol: -0.1 is not a number >= 0"]
    assert _problems("length_reward", {"target_len": 2.5}) == [
        "rewards[0] (length_reward).params.target_len: 2.5 is not an integer > 0"]
    assert _problems("repetition_penalty", {"max_penalty": 0.5, "ngram_size": True}) == [
        "rewards[0] (repetition_penalty).params.max_penalty: 0.5 is not a number <= 0",
        "rewards[0] (repetition_penalty).params.ngram_size: True is not an integer >= 1",
    ]


def test_the_shipped_answer_forms_are_the_annotation():
    import typing

    known = registry.available()
    module = sys.modules[known["math_correctness"].func.__module__]
    for name in ("math_correctness", "think_format_if_correct"):
        assert typing.get_args(known[name].param_types["answer_form"]) == module.ANSWER_FORMS == (
            "literal", "expression")


def test_a_drop_in_rewards_annotations_are_its_contract(tmp_path):
    write_reward(tmp_path / "typed", "typed", '''
        from __future__ import annotations

        from typing import Annotated, Literal

        from grpo_recipes.rewards import Range, reward

        @reward("typed_reward")
        def typed_reward(completions, *, mode: Literal["a", "b"] | None = None,
                         share: Annotated[float, Range(ge=0, le=1)] = 0.5, tag: str = "x", anything=None):
            return [0.0 for _ in completions]
    ''')
    known = registry.available([tmp_path / "typed"])
    rdef = known["typed_reward"]
    assert rdef.describe_params() == ["mode=None  (one of 'a', 'b' or null)", "share=0.5  (a number >= 0 and <= 1)",
                                      "tag='x'  (a string)", "anything=None  (any value)"]
    ok = {"mode": "b", "share": 1, "tag": "y", "anything": [1, {"x": 2}]}
    assert registry.check_specs([RewardSpec("typed_reward", params=ok)], known) == []
    assert registry.check_specs([RewardSpec("typed_reward", params={"mode": "c", "share": 1.5, "tag": 3})], known) == [
        "rewards[0] (typed_reward).params.mode: 'c' is not one of 'a', 'b' or null",
        "rewards[0] (typed_reward).params.share: 1.5 is not a number >= 0 and <= 1",
        "rewards[0] (typed_reward).params.tag: 3 is not a string",
    ]


def test_an_annotation_the_registry_cannot_check_is_refused_at_registration():
    from typing import Annotated, TypeVar

    T = TypeVar("T")

    def unresolved(completions, *, x: "NoSuchType" = 1):  # noqa: F821
        return [0.0]

    def unchecked(completions, *, x: T = 1):
        return [0.0]

    with pytest.raises(TypeError, match="annotation of parameter 'x' .* cannot be resolved"):
        registry._describe(unresolved, "bad", "here")
    def bounded_text(completions, *, x: Annotated[str, Range(gt=0)] = "a"):
        return [0.0]

    with pytest.raises(TypeError, match="parameter 'x' is annotated ~T, which the registry cannot check"):
        registry._describe(unchecked, "bad", "here")
    with pytest.raises(TypeError, match="parameter 'x' is annotated .*str.*, which the registry cannot check"):
        registry._describe(bounded_text, "bad", "here")


@pytest.mark.parametrize("where", ["yaml", "cli"])
def test_bad_param_values_stop_the_run_before_the_model_loads(where, run_env, monkeypatch, capsys):
    from grpo_recipes.run import runner

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(runner, "prepare_model", no_model)
    monkeypatch.setattr(runner, "load_splits", no_model)  # nor the data: the config alone shows the problem
    rewards = [{"name": "math_correctness", "params": {"answer_form": "expresion", "timeout_s": 0}},
               {"name": "boxed_format", "weight": 0.1}]
    base = (REPO / "recipes/configs/math_cpu.yaml").read_text().split("rewards:")[0]
    if where == "yaml":
        config = run_env / "bad.yaml"
        config.write_text(base + "rewards:\n" + "".join(f"  - {json.dumps(r)}\n" for r in rewards))
        argv = ["--config", str(config)]
    else:
        argv = ["--config", str(REPO / "recipes/configs/math_cpu.yaml"), "--rewards", json.dumps(rewards)]
    rc = runner.main("math", None, argv + ["--output_dir", str(run_env / "out")])
    err = capsys.readouterr().err
    assert rc == 2
    assert ("rewards[0] (math_correctness).params.answer_form: 'expresion' is not one of 'literal', 'expression'; "
            "did you mean 'expression'?") in err
    assert "rewards[0] (math_correctness).params.timeout_s: 0 is not a number > 0" in err


def test_a_drop_in_file_of_an_old_import_path_is_told_the_public_one(tmp_path):
    (tmp_path / "old_style.py").write_text("from grpo_recipes.registry import reward\n")
    with pytest.raises(ImportError, match=r"old_style.py failed to import: ModuleNotFoundError: .*grpo_recipes.registry"
                                          r".* imports its decorator from grpo_recipes.rewards"):
        registry.available([tmp_path])
